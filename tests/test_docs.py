"""The ```python blocks of docs/*.md run (```py blocks are illustrations, not run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_readme import fenced_blocks

DOCS = sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))
#: Pages that explain with prose and formulas only.
PROSE_ONLY = {"concepts.md"}


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_python_blocks_of_each_page_run_in_order(page, tmp_path):
    blocks = fenced_blocks(page.read_text(), "python")
    assert bool(blocks) != (page.name in PROSE_ONLY), f"{page.name}: python blocks changed"
    # Run as a script runs: blocks start their pipelines under `if __name__ == "__main__":`.
    namespace: dict = {"__name__": "__main__"}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # anything a block writes lands in a temporary folder
    try:
        for index, block in enumerate(blocks):
            exec(compile(block, f"{page.name} python block {index}", "exec"), namespace)
    finally:
        os.chdir(cwd)
