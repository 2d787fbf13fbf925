#!/usr/bin/env python3
"""Draw a datapar timeline (datapar train --trace, Chrome trace JSON) as a standalone HTML page.

Perfetto (ui.perfetto.dev) and chrome://tracing open the same file interactively; this page
needs neither a network nor a trace viewer, so a headless browser can photograph it:

    python3 scripts/trace_to_html.py run.json --steps 3 4 -o run.html
    chromium --headless --screenshot=run.png --window-size=1600,200 run.html   # Debian's chromium; as root add --no-sandbox

Rows are a rank's threads; spans are bars coloured by category, a bucket's "queued" moment
is a tick on the row of the thread that queued it.
"""
import argparse
import html
import json
import sys

COLOURS = {"step": "#4e79a7", "data": "#9c755f", "ddp": "#e15759", "bucket": "#f28e2b",
           "collective": "#76b7b2", "epoch": "#59a14f", "ddp metadata": "#b07aa1"}
ROW, LABEL, WIDTH = 26, 230, 1340


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, nargs=2, metavar=("FIRST", "LAST"),
                   help="draw only these steps (default: all)")
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    drawn = [e for e in events if e.get("ph") in ("X", "i")
             and (a.steps is None or a.steps[0] <= e["args"].get("step", -1) <= a.steps[1])]
    if not drawn:
        sys.exit("trace_to_html: no events to draw" + (" in steps %d-%d" % tuple(a.steps) if a.steps else ""))
    t0 = min(e["ts"] for e in drawn)
    t1 = max(e["ts"] + e.get("dur", 0) for e in drawn)
    scale = WIDTH / max(t1 - t0, 1.0)
    rows = sorted({(e["pid"], e["tid"]) for e in drawn})
    y_of = {r: 40 + i * ROW for i, r in enumerate(rows)}
    height = 40 + len(rows) * ROW + 60
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="12">' % (LABEL + WIDTH + 20, height)]
    title = "datapar timeline: %s%s" % (a.trace.split("/")[-1],
                                        ", steps %d-%d" % tuple(a.steps) if a.steps else "")
    out.append('<text x="10" y="20" font-size="15" font-weight="bold">%s</text>' % html.escape(title))
    for r in rows:  # row labels and bands
        y = y_of[r]
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>'
                   % (LABEL, y, WIDTH, ROW - 4, "#f4f4f4" if r[0] % 2 == 0 else "#eef2f7"))
        out.append('<text x="10" y="%d">rank %d: %s</text>'
                   % (y + 15, r[0], html.escape(names.get(r, "thread %d" % r[1]))))
    for e in sorted(drawn, key=lambda e: -e.get("dur", 0)):  # long ones first, short on top
        x = LABEL + (e["ts"] - t0) * scale
        y = y_of[(e["pid"], e["tid"])]
        colour = COLOURS.get(e.get("cat"), "#bab0ac")
        tip = "%s (step %s)" % (e["name"], e["args"].get("step"))
        if e["ph"] == "X":
            w = max(e["dur"] * scale, 1.0)
            tip += ": %.2f ms" % (e["dur"] / 1e3)
            out.append('<g><title>%s</title><rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" '
                       'stroke="white" stroke-width="0.5"/>' % (html.escape(tip), x, y, w, ROW - 4, colour))
            if w > 7 * len(e["name"]):
                out.append('<text x="%.1f" y="%d" fill="white">%s</text>' % (x + 3, y + 15, html.escape(e["name"])))
            out.append('</g>')
        else:
            out.append('<g><title>%s</title><path d="M %.1f %d l -4 -7 l 8 0 z" fill="%s"/></g>'
                       % (html.escape(tip), x, y + ROW - 4, colour))
    # Time axis in milliseconds.
    axis_y = 40 + len(rows) * ROW + 10
    span_ms = (t1 - t0) / 1e3
    tick = next(t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e9) if span_ms / t <= 12)
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (LABEL, axis_y, LABEL + WIDTH, axis_y))
    ms = 0.0
    while ms <= span_ms:
        x = LABEL + ms * 1e3 * scale
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/><text x="%.1f" y="%d" '
                   'text-anchor="middle">%g ms</text>' % (x, axis_y, x, axis_y + 5, x, axis_y + 18, ms))
        ms += tick
    legend_x = LABEL
    for cat, colour in COLOURS.items():
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (legend_x, axis_y + 30, colour, legend_x + 16, axis_y + 40, cat))
        legend_x += 30 + 8 * len(cat)
    out.append("</svg>")
    with open(a.output, "w") as f:
        f.write("<!DOCTYPE html><html><head><meta charset='utf-8'><title>%s</title></head>"
                "<body style='margin:0;background:white'>%s</body></html>\n" % (html.escape(title), "".join(out)))


if __name__ == "__main__":
    main()
