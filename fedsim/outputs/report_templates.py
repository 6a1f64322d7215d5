"""The report pages' Jinja2 templates (:mod:`fedsim.outputs.report`).

Python strings, not files beside the code: a Flower app bundle (FAB) carries
only ``.py``, ``.toml``, ``.md``, ``.yaml`` and ``.json`` files, and the
ServerApp of ``flwr run`` writes the report from the bundle's copy of fedsim.
"""

# ruff: noqa: E501  (HTML and CSS lines, kept as written)

TEMPLATES: dict[str, str] = {
    "base.html.j2": """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
  h1 { margin-bottom: 0.2em; }
  section { margin: 2em 0; }
  table { border-collapse: collapse; font-size: 0.9em; }
  th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
  th { background: #f3f3f3; }
  td.text, th.text { text-align: left; }
  pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
  figure { margin: 1em 0; }
  figure img { max-width: 100%; border: 1px solid #eee; }
  figcaption { font-size: 0.85em; color: #555; }
  .note { color: #555; font-size: 0.9em; }
  table.recon img { width: 64px; image-rendering: pixelated; }
  table.recon td.best { outline: 3px solid #2a7; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
{% if subtitle %}<p class="note">{{ subtitle }}</p>{% endif %}
{% block body %}{% endblock %}
<p class="note">Written by fedsim {{ version }}. Images are embedded: this file can be mailed or opened anywhere.</p>
</body>
</html>
""",
    "macros.html.j2": """\
{% macro table(frame_rows, columns) -%}
<table>
<thead><tr>{% for column in columns %}<th class="{{ column.kind }}">{{ column.title }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in frame_rows %}<tr>{% for column in columns %}<td class="{{ column.kind }}">{% if column.kind == "link" %}<a href="{{ row[column.key] }}">{{ row[column.key] }}</a>{% else %}{{ row[column.key] }}{% endif %}</td>{% endfor %}</tr>
{% endfor %}</tbody>
</table>
{%- endmacro %}
{% macro image(uri, alt, caption="") -%}
<figure><img src="{{ uri }}" alt="{{ alt }}">{% if caption %}<figcaption>{{ caption }}</figcaption>{% endif %}</figure>
{%- endmacro %}
""",
    "run.html.j2": """\
{% extends "base.html.j2" %}
{% import "macros.html.j2" as m %}
{% block body %}
<section id="overview">
<h2>Overview</h2>
<ul>{% for line in overview %}<li>{{ line }}</li>{% endfor %}</ul>
</section>

<section id="curves">
<h2>Training curves</h2>
{% if curves %}{{ m.image(curves, "accuracy and loss per round",
  "Accuracy and loss per round: test-* is the global model on the held-out test set, client-eval-* the clients' own evaluation on their local splits (mean), train-loss the clients' training loss; further per-round metrics below them.") }}
{% else %}<p>No finished round yet.</p>{% endif %}
</section>

{% if leaks_audited %}
<section id="audit-leaks">
<h2>Privacy audit: labels, membership, class representatives, words</h2>
<p>What the server learned from each client's update whatever its size, per round: the median over the round's clients of each client's strongest analysis, with a 95 % bootstrap interval. Labels: total-variation distance between the estimated and the true class proportions of what the client trained on (0 = exact; a uniform guess's beside it). Membership: ROC AUC over candidates the client trained on this round and held-out non-members of the same class mix (0.5 = chance), and the TPR at 1 % FPR. Class representatives: SSIM to the class-mean image of the client's data (the server's public class-mean images' beside it: what it knows without the update).</p>
{{ m.table(leak_rounds, leak_round_columns) }}
{% if roc_curves %}{{ m.image(roc_curves, "membership ROC curves",
  "Membership ROC on log axes, the first, a middle and the last audited round (a line per client and analysis; dashed: chance; every score in membership.csv). With n non-member candidates the FPR moves in steps of 1/n.") }}{% endif %}
{% if label_histograms %}{{ m.image(label_histograms, "estimated against true label histograms",
  "Examples per class in the last audited round: estimated (bars) against true (outline), each client's strongest label analysis; every round's in leaks.csv.") }}{% endif %}
{% if representatives %}<h3>Class representatives</h3>
<p>Per round and analysis, a row per client, a column per class its update was read for: the client's class-mean image above the representative, with its PSNR and SSIM to that mean (blank: not read from that client). Every tile is in the run folder's <code>audit/</code>.</p>
{% for table in representatives %}<table class="recon"><caption>Round {{ table.number }}: {{ table.analysis }}</caption>
<thead><tr><th class="text">client</th>{% for cls in table.classes %}<th>class {{ cls }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in table.rows %}<tr><td class="text">{{ row.client }}</td>{% for cell in row.cells %}<td>{% if cell.uri %}<img src="{{ cell.uri }}" alt="{{ cell.name }}">{% endif %}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% endfor %}{% endif %}
{% if word_sets %}<h3>Words</h3>
<p>The last audited round: the tokens each client's update named (the token-embedding rows its data moved) against the tokens it fed its model; every round's in leaks.csv.</p>
{{ m.table(word_sets.rows, word_sets.columns) }}{% endif %}
</section>
{% endif %}

{% if sentence_sets is defined %}
<section id="audit-sentences">
<h2>Privacy audit: sentences</h2>
<p>Per round, for each victim the best share of its sequences any text attack (dager, tag) recovered token for token; the median over victims with a 95 % bootstrap interval, and the median best ROUGE-1 (on token ids).</p>
{{ m.table(sentences_rounds.rows, sentences_rounds.columns) }}
<p>The last audited round: each text attack's recovered sequences under the truth, wrong tokens in brackets; every round's in audit.csv (text-recovered, text-truth).</p>
{{ m.table(sentence_sets.rows, sentence_sets.columns) }}
</section>
{% endif %}

{% if audited %}
<section id="audit-verdict">
<h2>Privacy audit: the verdict per round</h2>
<p>A round is only as private as its strongest attack allows. Per victim the verdict is the best PSNR, SSIM and label accuracy any attack reached (chosen with the truth, inside the scorer); per round, the median over victims with a 95 % bootstrap interval, and the share of victims at or above {{ success_psnr }} dB with a Wilson interval. A <em>lower bound</em> has an attack that did not converge: more steps could recover more.</p>
{{ m.image(verdict_curves, "audit verdict per round",
  "Verdict: median over victims of each victim's best attack, band = 95 % bootstrap interval; thin lines: each attack's median alone; hollow markers: lower bounds. Right: success share with its Wilson interval.") }}
{{ m.table(verdict_rounds, verdict_round_columns) }}
<h3>Per victim</h3>
<p>pick-*: the reconstruction the attacker would choose without the truth (the attack whose reconstruction best reproduces the intercepted gradient, lowest residual; an attack with no residual is never picked: adam-signs on a client that takes several steps an epoch, whose private reshuffle leaves Adam's replay unorderable; its fidelity-note says so).</p>
{{ m.table(verdict_victims, verdict_victim_columns) }}
</section>
{% endif %}

{% if reconstructed %}
<section id="audit-curves">
<h2>Single attacks per round</h2>
{{ m.image(audit_curves, "audit PSNR, SSIM and label accuracy per round",
  "Mean over the round's victims, one line per attack. PSNR: 10 log10(1/MSE) on [0, 1] pixels after Hungarian matching; the dashed line is the success threshold (" ~ success_psnr ~ " dB).") }}
</section>

<section id="audit-table">
<h2>Audit table</h2>
<p>Per attack; success = PSNR at or above {{ success_psnr }} dB. Mean and median leave non-finite PSNRs out.</p>
{{ m.table(audit_summary, audit_summary_columns) }}
<h3>Every attack</h3>
{{ m.table(audit_rows, audit_columns) }}
</section>

<section id="reconstructions">
<h2>Reconstructions</h2>
<p>Per round, a row per victim: its true batch, then each attack's matched reconstruction with its PSNR; the verdict's cell (the strongest attack on what the server received) is framed. Attacks named <em>-probe</em> are the counterfactual: one batch's gradient at the sent model, which the server of an update audit never receives. Every image with its labels and scores is in the run folder's <code>audit/</code>.</p>
{% for round in reconstruction_tables %}
<h3>Round {{ round.number }}</h3>
<table class="recon"><thead><tr><th class="text">client</th><th>truth</th>{% for attack in round.attacks %}<th>{{ attack }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in round.rows %}<tr><td class="text">{{ row.client }}</td><td>{% if row.truth %}<img src="{{ row.truth }}" alt="truth">{% endif %}</td>{% for cell in row.cells %}<td{% if cell.best %} class="best"{% endif %}>{% if cell.uri %}<img src="{{ cell.uri }}" alt="reconstruction"><br>{% endif %}{{ cell.text }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% endfor %}
</section>
{% endif %}


{% if plan %}
<section id="plan">
<h2>Resource plan</h2>
{% for item in plan %}<h3>{{ item.name }}</h3><pre>{{ item.text }}</pre>{% endfor %}
</section>
{% endif %}

<section id="scenario">
<h2>Scenario</h2>
<p class="note">The resolved scenario (every default filled in): rerun with <code>fedsim run scenario.toml</code>.</p>
<pre>{{ scenario }}</pre>
</section>
{% endblock %}
""",
    "compare.html.j2": """\
{% extends "base.html.j2" %}
{% import "macros.html.j2" as m %}
{% block body %}
<section id="privacy-utility">
<h2>Privacy and utility</h2>
{% if plot %}{{ m.image(plot, "final accuracy against audit PSNR",
  "One point per configuration (and attack): mean over seeds, bars one sample standard deviation.") }}
{% else %}<p>No finished runs.</p>{% endif %}
</section>

<section id="table">
<h2>Table</h2>
{{ m.table(table_rows, table_columns) }}
<p class="note">Accuracy and PSNR: mean ± sample std over seeds of each run's value (a run's PSNR is the mean over its audited attacks).
PSNR median, max and success pool every attack of every seed; success = PSNR at or above {{ success_psnr }} dB.
Accuracy is the final round's: <code>test-acc</code> (global model) where the strategy has one, else <code>client-eval-acc</code> (personalised).</p>
</section>

<section id="runs">
<h2>Runs</h2>
{{ m.table(run_rows, run_columns) }}
{% if failed %}<h3>Failed runs (left out above; rerun to retry)</h3>
<ul>{% for path, error in failed.items() %}<li><code>{{ path }}</code>: {{ error }}</li>{% endfor %}</ul>{% endif %}
</section>
{% endblock %}
""",
}
