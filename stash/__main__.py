import sys

from .cli.main import main

# A recall worker is a spawned interpreter that imports this module as
# __mp_main__; it must not start a second server.
if __name__ == "__main__":
    sys.exit(main())
