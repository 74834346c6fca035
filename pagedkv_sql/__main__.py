"""The way in: the `pagedkv-sql` console script and `python -m pagedkv_sql`.

A shell's TAB completion is answered here from a table (completion.py) before typer is
imported; everything else goes to the CLI (pagedkv_sql/cli/)."""

from __future__ import annotations


def main() -> None:
    from .completion import answer

    code = answer()
    if code is not None:
        raise SystemExit(code)
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
