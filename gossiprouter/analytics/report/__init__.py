"""The load-test report: its data model, report.json, report.html and the terminal summary.

Nothing here needs Spark: :mod:`gossiprouter.analytics.audit` (and
:mod:`gossiprouter.analytics.topics_audit`) computes a
:class:`~gossiprouter.analytics.report.model.Report` and these modules render it. The HTML is
self-contained (plots embedded as base64 PNG, made with matplotlib's Agg backend, so no
display is needed). One job a module, from the bottom up:

- :mod:`.parts`: the parts a report is made of (counts, findings, latency, throughput,
  breakdowns, events, load-test errors);
- :mod:`.manifest`: what the run's manifest tells the report (its status, events, the
  peers' errors, the send schedule);
- :mod:`.formatting`: how figures are written (milliseconds, counts);
- :mod:`.verdict`: the exit codes, the latency thresholds and the verdict;
- :mod:`.model`: the :class:`~.model.Report` itself, as report.json holds it, and its key
  figures;
- :mod:`.baseline`: ``analyze --baseline``: an earlier run's key figures, side by side;
- :mod:`.environment`: the machine and the router during the run (settings, CPU, memory);
- :mod:`.sections`: the report's tables as rows of text, for the summary and the page;
- :mod:`.summary`: the terminal summary;
- :mod:`.plots`: the matplotlib figures;
- :mod:`.html_page`: report.html;
- :mod:`.files`: writing report.json and report.html.
"""
