"""Write a benchmark's results between its two marker comments in bench/README.md."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def write_section(start: str, end: str, section: str, heading: str, readme: Path = README) -> None:
    """Replace what is between ``start`` and ``end``; append ``heading`` and both markers if missing."""
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    block = f"{start}\n{section}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + block + "\n"
    readme.write_text(text)
