from delivery.cli.main import main

main()
