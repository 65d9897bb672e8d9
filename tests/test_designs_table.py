"""The designs table (`taskcustody.verify.designs`) is the one home of the broken designs: the
model's variants, the demonstrations in `verify/broken.py`, the named mutants, and the lists in
docs/protocol.md and the documentation's pages must agree with it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from taskcustody_model.variants import VARIANTS, variant_listing

from mutation.named import MUTANTS
from taskcustody.core.server import Server
from taskcustody.verify import broken
from taskcustody.verify.designs import BY_NAME, CHOICES, DESIGNS, Design

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
README = ROOT / "README.md"
#: The page that says which part of `verify` finds which design.
MODEL_PAGE = ROOT / "docs" / "model.md"
#: The page with the table of named mutants.
MUTATION_PAGE = ROOT / "docs" / "development" / "mutation-gate.md"
MUTANT_NAMES = {m.name for m in MUTANTS}
NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
)

# The mutation gate runs the suite in a copy without docs/ and the README (mutation/gate.py).
needs_docs = pytest.mark.skipif(
    not (PROTOCOL.exists() and MODEL_PAGE.exists()),
    reason="no docs (e.g. the mutation gate's copy)",
)


def test_the_designs_are_numbered_one_to_n_in_order() -> None:
    assert [d.number for d in DESIGNS] == list(range(1, len(DESIGNS) + 1))
    assert len(BY_NAME) == len(DESIGNS)


# -- the model ------------------------------------------------------------------------------------


def test_the_model_has_a_variant_for_each_design_and_no_other() -> None:
    assert set(VARIANTS) - {"correct"} == set(BY_NAME)
    listed = [line.split()[0] for line in variant_listing().splitlines()]
    assert sorted(listed) == sorted(CHOICES)


@pytest.mark.parametrize("d", DESIGNS, ids=[d.name for d in DESIGNS])
def test_the_variant_s_description_carries_the_design_s_number(d: Design) -> None:
    assert d.variant.description.startswith(f"{d.number}. "), d.variant.description


# -- the demonstrations ---------------------------------------------------------------------------


def _demonstration_classes() -> dict[str, type[Server]]:
    """The public Server subclasses defined in verify/broken.py."""
    return {
        name: cls
        for name, cls in vars(broken).items()
        if inspect.isclass(cls)
        and issubclass(cls, Server)
        and cls.__module__ == broken.__name__
        and not name.startswith("_")
    }


def test_broken_holds_the_table_s_demonstrations_and_no_other() -> None:
    classes = _demonstration_classes()
    assert {d.name: classes[d.demo] for d in DESIGNS if d.demo is not None} == broken.BROKEN
    assert set(classes) == {d.demo for d in DESIGNS if d.demo is not None}


@pytest.mark.parametrize("d", DESIGNS, ids=[d.name for d in DESIGNS])
def test_each_design_has_a_demonstration_or_says_why_not(d: Design) -> None:
    if d.demo is None:
        assert d.no_demo, f"{d.name}: no demonstration and no reason"
        assert d.stateful is None, f"{d.name}: a stateful pin needs a demonstration to run"
    else:
        assert not d.no_demo
        # The class's own docstring (inspect.getdoc would inherit Server's): the servers of
        # worker-only designs carry none; their workers do.
        doc = inspect.cleandoc(vars(getattr(broken, d.demo)).get("__doc__") or "")
        if doc:
            assert doc.startswith(f"{d.number}. "), f"{d.demo}: {doc[:40]!r}"
    assert bool(d.stateful is None) == bool(d.no_stateful), (
        f"{d.name}: a design without a stateful pin says why, and only then"
    )


def test_the_stateful_pins_name_real_failure_kinds() -> None:
    properties = {d.breaks for d in DESIGNS} | {"no-double-commit"}
    for d in DESIGNS:
        if d.stateful is not None:
            for kind in d.stateful.kinds:
                assert kind == "conformance" or kind.removeprefix("real:") in properties, kind


# -- the named mutants ----------------------------------------------------------------------------


def test_a_named_mutant_of_a_design_s_bug_carries_the_design_s_name() -> None:
    assert {d.name for d in DESIGNS if d.mutant} == MUTANT_NAMES & set(BY_NAME)


def test_related_mutants_exist_and_are_not_designs() -> None:
    for d in DESIGNS:
        for name, how in d.related_mutants:
            assert name in MUTANT_NAMES, f"{d.name}: no named mutant {name!r}"
            assert name not in BY_NAME and how, name


def test_a_mutant_that_cites_a_design_is_the_table_s() -> None:
    """A mutant whose description cites "design N" is design N's, by name or as a related one."""
    cited = 0
    for m in MUTANTS:
        for number in re.findall(r"\bdesign (\d+)\b", m.breaks):
            d = DESIGNS[int(number) - 1]
            related = {name for name, _ in d.related_mutants}
            assert m.name == d.named_mutant or m.name in related, (m.name, d.name)
            cited += 1
    assert cited >= 2  # (promote-copies and composite-commits-unheld cite theirs)


# -- docs/protocol.md and the other pages ---------------------------------------------------------


def _protocol_section_7() -> str:
    text = PROTOCOL.read_text()
    start = text.index("\n## 7. ")
    return text[start : text.index("\n## ", start + 1)]


def _count_word() -> str:
    return NUMBER_WORDS[len(DESIGNS)]


@needs_docs
def test_the_protocol_lists_the_table_s_designs_in_order() -> None:
    headings = re.findall(r"^### (\d+)\. `([a-z-]+)`", _protocol_section_7(), re.M)
    assert [(int(n), name) for n, name in headings] == [(d.number, d.name) for d in DESIGNS]


@needs_docs
def test_the_protocol_says_what_each_design_breaks() -> None:
    sections = re.split(r"^### ", _protocol_section_7(), flags=re.M)[1:]
    assert len(sections) == len(DESIGNS)
    for d, section in zip(DESIGNS, sections, strict=True):
        breaks = re.search(r"\*Breaks\*:\s+\*\*([a-z-]+)\*\*", section)
        assert breaks is not None and breaks.group(1) == d.breaks, d.name
        length = re.search(r"\*Counterexample\* \((\d+) step", section)
        assert length is not None and int(length.group(1)) == d.pinned.length, d.name


def _stateless() -> set[int]:
    return {d.number for d in DESIGNS if d.stateful is None}


def _pages() -> list[Path]:
    return [p for p in (README, *sorted((ROOT / "docs").rglob("*.md"))) if p.exists()]


@needs_docs
@pytest.mark.parametrize("path", [PROTOCOL, MODEL_PAGE], ids=["protocol", "model"])
def test_the_docs_count_and_exceptions_match_the_table(path: Path) -> None:
    text = " ".join(path.read_text().split())
    counts = re.findall(r"\ball (?!but\b)(\w+)(?: designs\b|, and the stateful)", text)
    assert counts and set(counts) == {_count_word()}, counts
    exceptions = re.findall(r"all but designs ((?:\d+, )*\d+ and \d+)", text)
    assert exceptions and {frozenset(map(int, re.findall(r"\d+", e))) for e in exceptions} == {
        frozenset(_stateless())
    }


@needs_docs
def test_the_docs_cite_each_design_by_its_number_and_name() -> None:
    text = " ".join(" ".join(path.read_text().split()) for path in _pages())
    cited = re.findall(r"\b[Dd]esign (\d+), `([a-z-]+)`", text)
    for number, name in cited:
        assert BY_NAME[name].number == int(number), (number, name)
    for name in re.findall(r"--variant ([a-z][a-z-]*)", text):
        assert name in CHOICES or name == "list", name


@needs_docs
def test_the_docs_name_only_existing_named_mutants() -> None:
    text = " ".join(" ".join(path.read_text().split()) for path in _pages())
    named = re.findall(r"named mutant `([a-z-]+)`", text)
    table = re.findall(r"^\| `([a-z-]+)`: ", MUTATION_PAGE.read_text(), re.M)
    assert named and set(named) <= MUTANT_NAMES
    assert sorted(table) == sorted(MUTANT_NAMES)


@needs_docs
def test_the_model_page_s_table_is_written_from_the_designs_table() -> None:
    """docs/model.md's table is `python -m taskcustody.verify.designs_page`'s output: a design
    added, renamed or re-pinned without rewriting the page fails here."""
    from taskcustody.verify import designs_page

    text = MODEL_PAGE.read_text()
    assert designs_page.rewritten(text) == text, "run: python -m taskcustody.verify.designs_page"
    rows = re.findall(r"^\| (\d+) \| `([a-z-]+)` \|", text, re.M)
    assert [(int(n), name) for n, name in rows] == [(d.number, d.name) for d in DESIGNS]
    stale = text.replace(f"| `{DESIGNS[0].name}` |", "| `renamed` |", 1)
    assert designs_page.rewritten(stale) != stale
    assert designs_page.main(["--check", str(MODEL_PAGE)]) == 0


@pytest.mark.parametrize(
    ("args", "code"), [(["--help"], 0), (["--bogus"], 2), (["/nonexistent/page.md"], 2)]
)
def test_the_designs_page_command_answers_bad_arguments_in_one_line(
    args: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from taskcustody.verify import designs_page

    assert designs_page.main(args) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
