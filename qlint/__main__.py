from qlint.cli.main import main

raise SystemExit(main())
