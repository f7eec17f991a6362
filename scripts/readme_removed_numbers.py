"""The numbers the README carried at a base commit and no longer carries, and the page that now holds each.

A figure that leaves the README lands, with its date, in docs/history.md or benchmarks/RESULTS.md. This script
recomputes the list from git and writes it to scripts/readme_removed_numbers.tsv; tests/test_docs.py checks that
every listed number stands in its file beside its date, and that the list still covers what git recomputes.

    python scripts/readme_removed_numbers.py            # print the list
    python scripts/readme_removed_numbers.py --write    # rewrite scripts/readme_removed_numbers.tsv
    python scripts/readme_removed_numbers.py --base 6af3f08

A number is a decimal figure as the text writes it (0.79, 1,983, 1.9e-6; 0.79x counts as 0.79), not part of a name
(Qwen2.5-1.5B, 6x6, a commit hash), a date or a link's target. Its date is the first date of the README row or
paragraph that held it, else the base commit's own date. Its place is the first of docs/history.md and
benchmarks/RESULTS.md with a section (the text between two headings) that holds both the number and that date.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "6af3f08"
LIST = ROOT / "scripts" / "readme_removed_numbers.tsv"
PLACES = ("docs/history.md", "benchmarks/RESULTS.md")

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:e-?\d+)?(?=x\b|[^\w]|$)")


def numbers(text: str) -> set[str]:
    """The numbers of a text: dates and link targets left out."""
    text = DATE.sub(" ", LINK_TARGET.sub("]", text))
    return {m.group(0).rstrip(".,") for m in NUMBER.finditer(text)}


def blocks(text: str) -> list[str]:
    """A text cut into table rows (one each) and paragraphs (split at blank lines)."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        rows = [line for line in para.split("\n") if line.startswith("|")]
        rest = "\n".join(line for line in para.split("\n") if not line.startswith("|"))
        out.extend(rows)
        if rest.strip():
            out.append(rest)
    return out


def sections(text: str) -> list[str]:
    """A Markdown text cut at its headings (outside fenced code), each piece with its heading."""
    out, current, fenced = [], [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("#") and current:
            out.append("\n".join(current))
            current = []
        current.append(line)
    out.append("\n".join(current))
    return out


def lands(number: str, date: str, text: str) -> bool:
    """Whether a section of the text holds the number and the date."""
    return any(date in section and number in numbers(section) for section in sections(text))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def removed(old: str, new: str, base_date: str) -> list[tuple[str, str]]:
    """(number, date) for each number of the old README that the new one lacks, in the old README's order."""
    gone = numbers(old) - numbers(new)
    out: dict[str, str] = {}
    for block in blocks(old):
        for number in sorted(numbers(block) & gone, key=lambda n: block.index(n)):
            if number not in out:
                dates = DATE.findall(block)
                out[number] = dates[0] if dates else base_date
    return list(out.items())


def compute(base: str) -> list[tuple[str, str, str]]:
    old = git("show", f"{base}:README.md")
    base_date = git("show", "-s", "--format=%cs", base).strip()
    new = (ROOT / "README.md").read_text(encoding="utf-8")
    texts = {place: (ROOT / place).read_text(encoding="utf-8") for place in PLACES}
    rows = []
    for number, date in removed(old, new, base_date):
        place = next((p for p in PLACES if lands(number, date, texts[p])), "MISSING")
        rows.append((number, date, place))
    return rows


def read_list(path: Path = LIST) -> list[tuple[str, str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines[1:] if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=BASE, help="the commit whose README is compared (default %(default)s)")
    parser.add_argument("--write", action="store_true", help=f"write the list to {LIST.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    rows = compute(args.base)
    text = "number\tdate\tfile\n" + "".join("\t".join(row) + "\n" for row in rows)
    if args.write:
        LIST.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    missing = [row for row in rows if row[2] == "MISSING"]
    for number, date, _ in missing:
        print(f"{number} ({date}) left the README and is in neither {' nor '.join(PLACES)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
