from lifecycle_service.server import main

main()
