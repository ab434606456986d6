"""`python3 -m recommender ARGS` runs the `recommend` command (handy from a source checkout)."""

from recommender.cli import main

if __name__ == "__main__":
    main()
