"""``python -m cdiflow``."""

from cdiflow.cli import main

if __name__ == "__main__":
    main()
