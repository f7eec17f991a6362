"""The docs a newcomer reads: the README stays a short product page, every page opens with what holds now, every
link and every "RESULTS section N" reference finds its target, no page speaks of issues, and a figure that leaves the
README stands, with its date, in docs/history.md or benchmarks/RESULTS.md (scripts/readme_removed_numbers.py)."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
DOCS = ROOT / "docs"
MARKDOWN = [README, ROOT / "CONTRIBUTING.md", RESULTS, *sorted(DOCS.rglob("*.md"))]
# where code, configs and tests point into RESULTS.md
CODE = [
    *sorted((ROOT / "lightning_epo").rglob("*.py")), *sorted((ROOT / "conf").rglob("*.yaml")),
    *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
    *sorted(p for p in (ROOT / "scripts").iterdir() if p.is_file()), ROOT / "Makefile",
]
MAX_README_LINES = 200
MAX_ROW_CHARS = 240


def load_script():
    spec = importlib.util.spec_from_file_location("readme_removed_numbers", ROOT / "scripts/readme_removed_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text_outside_fences(text: str) -> str:
    """The text with fenced code blocks blanked (their lines kept, so line numbers hold)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page has: its headings' slugs (repeats numbered as GitHub numbers them) and explicit ids."""
    text = path.read_text(encoding="utf-8")
    found: set[str] = set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", text))
    seen: dict[str, int] = {}
    for line in text_outside_fences(text).split("\n"):
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            slug = github_slug(match.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def results_rows() -> list[str]:
    lines = README.read_text(encoding="utf-8").split("\n")
    start = lines.index("## Results")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return [line for line in lines[start:end] if line.startswith("|")][2:]


def test_the_readme_is_a_short_page_that_shows_the_two_commands_first():
    lines = README.read_text(encoding="utf-8").split("\n")
    assert len(lines) - (lines[-1] == "") <= MAX_README_LINES
    first_block = lines[lines.index("```bash") + 1:]
    assert first_block[0].startswith("make train") and first_block[1].startswith("make test")


def test_every_results_row_is_short_and_keeps_its_date_and_its_link():
    rows = results_rows()
    assert len(rows) >= 10
    for row in rows:
        assert len(row) <= MAX_ROW_CHARS, f"{len(row)} characters: {row[:80]}"
        assert re.search(r"\(20\d\d-\d\d-\d\d", row), f"no date: {row[:80]}"
        assert re.search(r"\]\([^)]+\)", row), f"no link: {row[:80]}"
        assert "faster" not in row, f"a speed-up where the table writes time ratios: {row[:80]}"


def test_the_readme_lists_every_option_of_each_config_group():
    """Its table of groups (``| `env` | `gridworld`, ... |``) is where a user finds what to type: a config file of a
    group that the row leaves out (smollm2_sciworld, the ScienceWorld recipe, was missing) is an option unseen."""
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", README.read_text(encoding="utf-8"), re.MULTILINE)
    groups = {group: set(re.findall(r"`([\w.\-]+)`", options)) for group, options in rows
              if (ROOT / "conf" / group).is_dir()}
    assert {"env", "algo", "model", "experiment"} <= groups.keys(), groups.keys()
    for group, listed in groups.items():
        files = {path.stem for path in (ROOT / "conf" / group).glob("*.yaml")}
        assert files <= listed, f"the README's {group} row lacks {sorted(files - listed)}"


def test_the_readme_says_once_which_ratio_it_writes():
    assert README.read_text(encoding="utf-8").count("Ratios are time ratios") == 1


def test_every_relative_link_finds_its_file_and_anchor():
    checked = 0
    for page in MARKDOWN:
        text = text_outside_fences(page.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.relative_to(ROOT)}: {target} (no such file)"
            if anchor:
                assert file.suffix == ".md", f"{page.relative_to(ROOT)}: {target}"
                assert anchor in anchors(file), f"{page.relative_to(ROOT)}: {target} (no such anchor)"
            checked += 1
    assert checked >= 50


def section_numbers(spec: str) -> list[int]:
    """'14' -> [14]; '14 and 16' -> [14, 16]; '14-17' -> [14, 15, 16, 17]; '2b' -> [2]."""
    numbers: list[int] = []
    for part in re.split(r"\s*(?:,|and)\s*", spec):
        ends = [int(re.match(r"\d+", end).group(0)) for end in re.split(r"\s*[-–]\s*|\s+to\s+", part) if end]
        numbers.extend(range(ends[0], ends[-1] + 1))
    return numbers


SECTION_SPEC = r"(\d+[a-z]?(?:\s*(?:,|and|-|–)\s*\d+[a-z]?(?![.\w-]))*)"  # "14", "14 and 16", "14-17"
NAMED_REFERENCE = re.compile(r"RESULTS(?:\.md)?\)?,?[\s#\"*]*(?:sections?\s+|§\s*)" + SECTION_SPEC)
BARE_REFERENCE = re.compile(r"(?<![\w/#-])(?:[Ss]ections?\s+|§\s*)" + SECTION_SPEC)


def results_references() -> list[tuple[str, int]]:
    """(where, N) for every "RESULTS.md section N" of code, configs and tests, and every "section N" or "§N" of the
    Markdown pages (their numbered sections are RESULTS.md's)."""
    found = []
    for file in CODE:
        text = file.read_text(encoding="utf-8", errors="replace")
        for match in NAMED_REFERENCE.finditer(text):
            found += [(f"{file.relative_to(ROOT)}: {match.group(0)!r}", n) for n in section_numbers(match.group(1))]
    for page in MARKDOWN:
        text = page.read_text(encoding="utf-8")
        for match in BARE_REFERENCE.finditer(text):
            found += [(f"{page.relative_to(ROOT)}: {match.group(0)!r}", n) for n in section_numbers(match.group(1))]
    return found


def test_results_sections_keep_their_numbers_as_anchors():
    text = RESULTS.read_text(encoding="utf-8")
    numbered = [int(n) for n in re.findall(r"^#+ (\d+)\. ", text, re.M)]
    assert numbered and sorted(numbered) == list(range(1, max(numbered) + 1))
    for n in numbered:
        assert re.search(rf'<a id="section-{n}"></a>\n\n#+ {n}\. ', text), f"section {n} has no section-{n} anchor"


def test_every_reference_to_a_results_section_finds_it():
    text = RESULTS.read_text(encoding="utf-8")
    references = results_references()
    assert len(references) >= 37, len(references)
    for where, n in references:
        assert f'<a id="section-{n}"></a>' in text, f"{where}: benchmarks/RESULTS.md has no section {n}"


def pages():
    return sorted(p for p in DOCS.glob("*.md") if p.name != "README.md")


def is_preregistration(page: Path) -> bool:
    return page.read_text(encoding="utf-8").split("\n")[0].rstrip().endswith("pre-registration")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_page_opens_with_what_holds_now(page):
    lines = page.read_text(encoding="utf-8").split("\n")
    label = "Outcome" if is_preregistration(page) else "Now"
    assert lines[0].startswith("# ") and lines[1] == ""
    assert re.match(rf"> \*\*{label} \((?:added )?20\d\d-\d\d-\d\d", lines[2]), f"{page.name} opens with {lines[2]!r}"
    box = 2
    while box < len(lines) and lines[box].startswith("> ") and lines[box] != ">":
        box += 1
    assert box <= 15, f"{page.name}: its first screen runs to line {box}"


def test_the_docs_index_has_one_line_a_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in pages():
        assert len(re.findall(rf"^- \[{re.escape(page.name)}\]\({re.escape(page.name)}\)", index, re.M)) == 1, page.name


PROJECT_ISSUE = re.compile(r"\bissues? #?\d+|work\s+in\s+progress", re.IGNORECASE)
BARE_ISSUE = re.compile(r"(?<![\w/&])#\d{1,3}\b")  # "#64" in prose; code's strings use "#0" for other things
UPSTREAM_ISSUE = re.compile(r"\b[A-Z][\w.-]* issue #?\d+|[\w.-]+/[\w.-]+#\d+")  # Lightning issue #17523, owner/repo#1


def test_the_repository_speaks_of_the_project_not_of_its_issues():
    """Outside the pre-registration pages (kept as committed); upstream projects' issues may be named."""
    prose = [p for p in MARKDOWN if not (p.parent == DOCS and is_preregistration(p))]
    prose += [p for p in CODE if p.suffix == ".yaml"]
    for file in prose + CODE:
        text = file.read_text(encoding="utf-8", errors="replace")
        text = UPSTREAM_ISSUE.sub("", re.sub(r"\]\([^)]*\)", "]", text))  # link targets: #11-the-... is an anchor
        patterns = [PROJECT_ISSUE, BARE_ISSUE] if file in prose else [PROJECT_ISSUE]
        for match in (m for pattern in patterns for m in pattern.finditer(text)):
            line = text.count("\n", 0, match.start()) + 1
            pytest.fail(f"{file.relative_to(ROOT)}:{line}: {match.group(0)!r}")


def test_every_number_that_left_the_readme_stands_with_its_date_where_the_list_says():
    script = load_script()
    listed = script.read_list()
    assert len(listed) >= 20
    for number, date, place in listed:
        assert place in script.PLACES, (number, place)
        assert script.lands(number, date, (ROOT / place).read_text(encoding="utf-8")), f"{number} ({date}) in {place}"


def test_the_list_of_numbers_covers_what_git_recomputes():
    """Recomputed from the README at the base commit against today's: a number removed since is listed too."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    script = load_script()
    known = subprocess.run(["git", "cat-file", "-e", f"{script.BASE}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"this clone lacks commit {script.BASE} (shallow?)")
    listed = {(number, date) for number, date, _ in script.read_list()}
    for number, date, place in script.compute(script.BASE):
        assert (number, date) in listed, f"{number} ({date}) left the README; run scripts/readme_removed_numbers.py"
        assert place != "MISSING", f"{number} ({date}) is in neither {script.PLACES}"
