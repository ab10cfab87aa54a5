"""What a job printed, shown on the user's terminal: its colours, and nothing else a terminal acts on.

A job's output is someone else's text. Written to a terminal as it is, an escape sequence in it can
set the window's title, write the clipboard (OSC 52), plant a link, move the cursor over what was
printed before, or make the terminal answer as if typed. On a terminal, :func:`echo` keeps colours
and styles (SGR, ``ESC [ ... m``), tabs, newlines and carriage returns (a progress bar's redraw),
and drops every other control: CSI sequences, OSC, DCS and the other strings, other escapes, C0
controls and C1 controls (U+0080 to U+009F, which some terminals read as escapes). Written to a pipe
or a file, the text goes as it is.
"""

from __future__ import annotations

import re
import sys

import click

#: Colours and styles: the only sequences kept.
_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_CONTROLS = re.compile(
    # CSI (ESC [, or C1's): cursor, erasing, modes, reports; SGR among them.
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    # OSC, DCS, SOS, PM, APC (ESC ], P, X, ^, _, or C1's): a string, up to BEL or ST.
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    # Any other escape: character sets, resets, keypad modes.
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
    # C0 but tab, newline and return; DEL; the other C1 controls.
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
)


def for_terminal(text: str) -> str:
    """``text`` with every control a terminal would act on dropped, but colours (see the module)."""
    return _CONTROLS.sub(lambda found: found.group() if _SGR.fullmatch(found.group()) else "", text)


def echo(text: str, *, err: bool = False) -> None:
    """One line of text a job (or its worker) wrote, on stdout or stderr: on a terminal, through
    :func:`for_terminal`; to a pipe or a file, unchanged (colours included)."""
    stream = sys.stderr if err else sys.stdout
    click.echo(for_terminal(text) if stream.isatty() else text, err=err, color=True)
