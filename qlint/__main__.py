from qlint.cli import main

raise SystemExit(main())
