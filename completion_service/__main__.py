from completion_service.server import main

main()
