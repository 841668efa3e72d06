"""``python -m tformer`` runs the command line (and lets ``torchrun -m tformer`` launch it)."""

from tformer.cli import main

if __name__ == "__main__":
    main()
