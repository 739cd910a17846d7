"""The README's example runs, and its Quick start commands are the ones CI runs."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"

RUN_COMMAND = "pip install -e . && xpatch demo"
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest'


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}[ \t]*\n(.*?)^```[ \t]*$", text, re.DOTALL | re.MULTILINE)


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def code_lines(path: Path) -> list[str]:
    """Non-blank lines of a shell script with comments stripped."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            lines.append(stripped)
    return lines


README_TEXT = README.read_text()
PYTHON_BLOCKS = fenced_blocks(README_TEXT, "python")


def test_readme_has_python_examples():
    assert PYTHON_BLOCKS, "README.md has no ```python block to run"


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs(index):
    code = compile(PYTHON_BLOCKS[index], f"README.md python block {index}", "exec")
    exec(code, {"__name__": f"readme_block_{index}"})


def test_quick_start_has_exactly_the_two_commands():
    quick_start = section(README_TEXT, "Quick start")
    commands = [
        line.strip()
        for block in fenced_blocks(quick_start, "bash")
        for line in block.splitlines()
        if line.strip()
    ]
    assert commands == [RUN_COMMAND, TEST_COMMAND]
    assert "two commands CI uses" in quick_start


def test_ci_run_is_an_executable_strict_bash_script():
    text = CI_RUN.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in code_lines(CI_RUN)
    assert os.access(CI_RUN, os.X_OK), ".ci/run is not executable"


@pytest.mark.parametrize("command", [RUN_COMMAND, TEST_COMMAND])
def test_ci_run_executes_the_readme_command(command):
    """The command is run verbatim: directly, or stored in a variable that bash -c runs."""
    lines = code_lines(CI_RUN)
    if command in lines:
        return
    assignments = [
        line for line in lines if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", line) and command in line
    ]
    assert assignments, f".ci/run does not run {command!r}"
    name, _, value = assignments[0].partition("=")
    assert shlex.split(value) == [command], f"{name} in .ci/run is not exactly {command!r}"
    runs = [line for line in lines if re.search(rf'\bbash\b.* -c "\${name}"$', line)]
    assert runs, f".ci/run defines {name} but never runs it with bash -c"


def test_ci_run_lints():
    lines = code_lines(CI_RUN)
    assert "ruff check ." in lines
    assert "ruff format --check ." in lines
