from prunetrain.cli import main

main()
