"""`python -m mtx ...`, which is how torchrun starts the trainer on every rank."""

from mtx.cli import main

main()
