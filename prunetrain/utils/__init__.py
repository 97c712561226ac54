"""Small shared helpers: progress bars, devices and precision, figures and TensorBoard, argument validation."""
