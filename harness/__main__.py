from attnbench.cli.app import main

main()
