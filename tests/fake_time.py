"""A time source for the training clock's tests: it advances only when a test's work "sleeps", so what the clock
counts and leaves out is checked exactly, independent of how fast the machine runs the real work.

`install()` points the training clock and the metric-points callback (the two modules that read time for the clock)
at a `FakeTime`. The tests of one process use it through a fixture; a torchrun script installs it in each rank."""

from __future__ import annotations


class FakeTime:
    """Stands in for the `time` module where the clock reads it: `perf_counter()` and `time()` return the current
    fake time, `sleep(seconds)` advances it (and returns at once)."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def install(fake: FakeTime, setattr_=setattr) -> FakeTime:
    """Make the training clock read `fake` (`setattr_`: pytest's `monkeypatch.setattr` to undo it after a test)."""
    import prunetrain.training.metric_points as metric_points
    import prunetrain.training.training_clock as training_clock

    setattr_(training_clock, "time", fake)
    setattr_(metric_points, "time", fake)
    return fake
