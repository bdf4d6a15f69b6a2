from delivery.cli import main

main()
