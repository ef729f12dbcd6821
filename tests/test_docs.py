"""The docs a reader follows: every relative link in README.md, docs/ and bench/README.md resolves
(to a file, and to a heading where it names one); every command they give in a `bash` block names a
file that exists and, for a script, parses with that script's flags; and the blocks marked
`<!-- test: runs, eval return >= R -->` run as written and reach R."""

import importlib
import re
import shlex
from pathlib import Path

import pytest
from helpers import run_script

from common import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=str,
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
RUNS = re.compile(
    r"^<!-- test: runs, eval return >= ([-\d.]+) -->\n```bash\n(.*?)^```", re.S | re.M
)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", strip_code(page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def strip_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """The commands of a `bash` block: one per line (a trailing backslash continues it), without
    comments."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            found.append(line)
    return found


def test_every_page_is_checked_and_every_script_has_its_page():
    names = {page_id(p) for p in PAGES}
    for script in sorted((ROOT / "algos").glob("[a-z]*.py")):
        assert f"docs/algorithms/{script.stem}.md" in names, f"{script.stem} has no docs page"
        assert f"docs/algorithms/{script.stem}.md" in (ROOT / "README.md").read_text(), (
            f"README.md does not link docs/algorithms/{script.stem}.md"
        )


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(strip_code(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no file {file.relative_to(ROOT)})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.relative_to(ROOT)})")
    assert not broken, f"{page_id(page)}: broken links: {', '.join(broken)}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_name_files_that_exist_and_flags_the_scripts_take(page, capsys):
    problems = []
    for command in [c for block in FENCE.findall(page.read_text()) for c in commands(block)]:
        words = shlex.split(command)
        if words[0] != "python":
            continue
        if words[1] == "-m":  # python -m pytest FILE, python -m common.plot
            files = [w for w in words[3:] if w.endswith(".py") and not w.startswith("-")]
        else:
            files = [words[1]]
        problems += [f"{command}: no file {f}" for f in files if not (ROOT / f).exists()]
        if words[1].startswith("algos/") and (ROOT / words[1]).exists():
            module = importlib.import_module(f"algos.{Path(words[1]).stem}")
            parser = cli.build_parser(module.Config, "")
            # whole names: argparse would take a prefix (--total-step) for the flag it starts
            problems += [
                f"{command}: {flag} is not a flag of {words[1]}"
                for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--"))
                if flag not in parser._option_string_actions
            ]
            try:
                # a --resume names a run that the docs cannot hold: its flags parse all the same
                if "--resume" in words:
                    parser.parse_args(words[2:])
                else:
                    cli.parse_config(module.Config, words[2:])
            except SystemExit as exit:  # --help exits 0
                if exit.code:
                    problems.append(f"{command}: {capsys.readouterr().err.strip()}")
    assert not problems, f"{page_id(page)}: " + "; ".join(problems)


RUNNABLE = [
    (page, float(goal), command)
    for page in PAGES
    for goal, block in RUNS.findall(page.read_text())
    for command in commands(block)
]


@pytest.mark.slow  # whole runs in new processes
@pytest.mark.learning  # compiled as a user's run is, with XLA's optimizations
@pytest.mark.parametrize(
    "page, goal, command", RUNNABLE, ids=[f"{page_id(p)}: {c}" for p, _, c in RUNNABLE]
)
def test_a_block_marked_runnable_runs_as_written_and_reaches_its_return(
    tmp_path, page, goal, command
):
    """Run from an empty directory (the run directory lands there), the script named by its path
    in the repository."""
    words = shlex.split(command)
    assert words[0] == "python" and words[1].startswith("algos/"), command
    out = run_script(Path(words[1]).stem, *words[2:], cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    returns = re.findall(r"eval return (-?[\d.]+)", out.stdout)
    assert returns and float(returns[-1]) >= goal, f"{command}: {out.stdout[-1000:]}"


def test_the_readme_marks_its_first_command_runnable():
    assert any(page.name == "README.md" for page, _, _ in RUNNABLE)
