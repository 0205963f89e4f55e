"""compare_report.html carries what the terminal prints: the headline with the threshold view and the reason
they differ, the divergence chain and the top divergences as sections of their own, and the suspects
table's columns explained at the table. Before, the chain was only in the collapsed JSON blob and the
columns were explained only above the plot. Hand-written dumps (``test_propagation._chain``), the CLI in a
fresh interpreter."""

import re

from .conftest import run_compare
from .test_propagation import OPS, _chain


def _page(tmp_path):
    errors = [0.0] * len(OPS)
    errors[1] = errors[2] = 2e-4  # gelu.0 puts the error in, below the threshold; linear.1 crosses it
    for later in range(3, len(OPS)):
        errors[later] = 2e-3
    a, b = _chain(tmp_path, errors, OPS)
    code, out, err = run_compare(a, b, "-o", tmp_path / "out")
    assert code == 1, out + err
    page = (tmp_path / "out" / "compare_report.html").read_text()
    return page[: page.index("<details><summary>JSON summary")]  # what a reader sees without opening the blob


def test_the_chain_and_the_top_divergences_are_sections(tmp_path):
    page = _page(tmp_path)
    chain = page[page.index('<h3 id="chain-0">Divergence chain</h3>') :]
    chain = chain[: chain.index("</ol>")]
    names = re.findall(r"<li><code>([^<]+)</code></li>", chain)
    assert names[0] == "Functional.linear.1.forward" and len(names) == 15
    assert names[1:3] == ["Functional.gelu.1.forward", "Functional.layer_norm.1.forward"]
    top = page[page.index('<h3 id="top-0">Top divergences</h3>') :]
    assert "decision error" in top[: top.index("<table")]
    assert top.count("<tr>") == 11  # the header and the 10 worst


def test_the_headline_is_the_suspect_with_the_threshold_view_and_the_reason(tmp_path):
    page = _page(tmp_path)
    suspect = page.index("<b>First suspect:</b> <code>Functional.gelu.0.forward</code>")
    view = page.index("Threshold view, first divergence: <code>Functional.linear.1.forward</code>")
    why = page.index("<b>Why they differ:</b> Functional.gelu.0.forward runs first")
    assert suspect < view < why < page.index("<h2>")


def test_the_suspects_columns_are_explained_at_the_table(tmp_path):
    page = _page(tmp_path)
    table = page.index('<table class="suspects">')
    legend = page[page.rindex("<p>", 0, table) : table]
    for column in ("output error", "input error", "gain", "allowance", "noise floor", "score", "rank by score"):
        assert f"<b>{column}</b>:" in legend
    assert '<th title="output error / input error">gain</th>' in page[table:]
