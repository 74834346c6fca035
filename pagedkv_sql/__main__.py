"""The way in: the `pagedkv-sql` console script and `python -m pagedkv_sql`.

A shell's TAB completion is answered here from a table (completion.py) before typer is
imported; everything else goes to the CLI (pagedkv_sql/cli/)."""

from __future__ import annotations

import sys


def main() -> None:
    from .completion import answer

    code = answer()
    if code is not None:
        raise SystemExit(code)
    try:  # typer and the command groups: a tenth of a second or more on a busy machine
        from .cli import main as cli_main
    except KeyboardInterrupt:  # a Ctrl-C there: nothing was begun (cli.main says the same)
        sys.stderr.write("Error: interrupted; nothing was changed\n")
        raise SystemExit(130) from None
    cli_main()


if __name__ == "__main__":
    main()
