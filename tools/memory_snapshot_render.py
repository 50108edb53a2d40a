#!/usr/bin/env python3
"""Render a tandem memory snapshot (JSON, schema tandem.memory.snapshot/1) as a self-contained
HTML page or SVG picture: every segment with its blocks (allocated blocks coloured by allocation
site, thread-cached and free blocks greyed), a memory-over-time chart (live and reserved bytes per
step) and a table of allocation sites. Standard library only.

    tools/memory_snapshot_render.py snapshot.json -o snapshot.html   # or .svg
    tools/memory_snapshot_render.py snapshot.json -o out.html --check  # also validate (tests)
"""
import argparse
import hashlib
import html
import json
import sys

WIDTH = 1000
ROW = 22
STATE_COLOURS = {"free": "#e6e6e6", "thread_cached": "#f4c27a"}


def human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def site_colour(index):
    if index is None or index < 0:
        return "#4c78a8"
    h = int(hashlib.md5(str(index).encode()).hexdigest()[:6], 16)
    return f"hsl({h % 360},60%,{45 + (h >> 9) % 20}%)"


def segments_svg(snap, y0):
    parts = []
    sites = snap.get("sites", [])
    y = y0
    parts.append(f'<text x="0" y="{y + 14}" font-weight="bold">Segments ({len(snap["segments"])})</text>')
    y += 24
    for seg in snap["segments"]:
        size = max(seg["size"], 1)
        label = f'{seg["pool"]} {human(seg["size"])} @0x{seg["address"]:x}'
        if seg.get("stream"):
            label += f' stream 0x{seg["stream"]:x}'
        parts.append(f'<text x="0" y="{y + 15}" font-size="11">{html.escape(label)}</text>')
        x0 = 260
        span = WIDTH - x0
        for b in seg["blocks"]:
            x = x0 + span * (b["address"] - seg["address"]) / size
            w = max(span * b["size"] / size, 0.5)
            state = b["state"]
            colour = STATE_COLOURS.get(state) or site_colour(b.get("site"))
            tip = f'{state} {human(b["size"])} @0x{b["address"]:x}'
            if b.get("requested"):
                tip += f', requested {human(b["requested"])}'
            if b.get("step", -1) >= 0:
                tip += f', step {b["step"]}'
            s = b.get("site", -1)
            if s is not None and 0 <= s < len(sites):
                tip += "\n" + sites[s]["label"]
            parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 4}" fill="{colour}" '
                         f'stroke="#555" stroke-width="0.3"><title>{html.escape(tip)}</title></rect>')
        y += ROW
    return "\n".join(parts), y


def timeline_svg(snap, y0):
    points = snap.get("timeline", [])
    height = 180
    parts = [f'<text x="0" y="{y0 + 14}" font-weight="bold">Memory over time ({len(points)} steps)</text>']
    top = y0 + 24
    if not points:
        parts.append(f'<text x="0" y="{top + 14}" font-size="11">no timeline (mark_step() never called '
                     f'on a TrackingResource)</text>')
        return "\n".join(parts), top + 24
    steps = [p["step"] for p in points]
    peak = max(max(p["live_bytes"], p["reserved_bytes"]) for p in points) or 1
    s0, s1 = min(steps), max(steps)
    span = max(s1 - s0, 1)
    x0 = 60

    def xy(step, value):
        return x0 + (WIDTH - x0) * (step - s0) / span, top + height - height * value / peak

    parts.append(f'<rect x="{x0}" y="{top}" width="{WIDTH - x0}" height="{height}" fill="none" stroke="#999"/>')
    for key, colour in (("reserved_bytes", "#e45756"), ("live_bytes", "#4c78a8")):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(p["step"], p[key]) for p in points))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    parts.append(f'<text x="0" y="{top + 10}" font-size="10">{human(peak)}</text>')
    parts.append(f'<text x="0" y="{top + height}" font-size="10">0</text>')
    parts.append(f'<text x="{x0}" y="{top + height + 14}" font-size="10">step {s0}</text>')
    parts.append(f'<text x="{WIDTH - 60}" y="{top + height + 14}" font-size="10">step {s1}</text>')
    parts.append(f'<text x="{x0 + 100}" y="{top + height + 14}" font-size="10" fill="#4c78a8">live</text>')
    parts.append(f'<text x="{x0 + 140}" y="{top + height + 14}" font-size="10" fill="#e45756">reserved</text>')
    return "\n".join(parts), top + height + 24


def render_svg(snap):
    seg, y = segments_svg(snap, 0)
    tl, y = timeline_svg(snap, y + 10)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" '
            f'font-family="sans-serif" font-size="12">\n{seg}\n{tl}\n</svg>\n')


def render_html(snap):
    stats = snap.get("stats", {})
    rows = []
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"):
        st = stats.get(key)
        if isinstance(st, dict):
            rows.append(f"<tr><td>{key}</td><td>{human(st['current'])}</td><td>{human(st['peak'])}</td></tr>")
    live_by_site = {}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "allocated" and b.get("site", -1) >= 0:
                live_by_site[b["site"]] = live_by_site.get(b["site"], 0) + b["size"]
    site_rows = []
    for idx, live in sorted(live_by_site.items(), key=lambda kv: -kv[1]):
        site = snap["sites"][idx]
        frames = html.escape("\n".join(site.get("frames", [])))
        site_rows.append(f'<tr><td><span style="color:{site_colour(idx)}">&#9632;</span> '
                         f'{html.escape(site["label"])}</td><td>{human(live)}</td>'
                         f'<td><details><summary>stack</summary><pre>{frames}</pre></details></td></tr>')
    hit = stats.get("cache_hit_rate", 0.0)
    frag = stats.get("fragmentation", 0.0)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tandem memory snapshot</title>
<style>body{{font-family:sans-serif;margin:20px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left}} pre{{font-size:11px}}</style></head>
<body><h1>tandem memory snapshot</h1>
<p>cache hit rate {100 * hit:.1f}%, fragmentation {100 * frag:.0f}%, largest free block
{human(stats.get('largest_free_block', 0))}. Colours: allocated blocks by site; orange thread-cached; grey free.</p>
<table><tr><th>stat</th><th>current</th><th>peak</th></tr>{''.join(rows)}</table>
{render_svg(snap)}
<h2>Live memory by allocation site</h2>
<table><tr><th>site</th><th>live</th><th>stack</th></tr>{''.join(site_rows)}</table>
</body></html>
"""


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot")
    ap.add_argument("-o", "--output", required=True, help="output file, .html or .svg")
    ap.add_argument("--check", action="store_true", help="validate the snapshot and the output")
    args = ap.parse_args(argv)
    with open(args.snapshot, encoding="utf-8") as f:
        snap = json.load(f)
    if snap.get("schema") != "tandem.memory.snapshot/1":
        print(f"memory_snapshot_render: {args.snapshot}: unknown schema {snap.get('schema')!r}", file=sys.stderr)
        return 1
    out = render_svg(snap) if args.output.endswith(".svg") else render_html(snap)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(out)
    if args.check:
        problems = []
        if not snap["segments"]:
            problems.append("no segments")
        for seg in snap["segments"]:
            at = seg["address"]
            for b in seg["blocks"]:
                if b["address"] != at:
                    problems.append(f"segment 0x{seg['address']:x}: blocks do not tile it")
                    break
                at += b["size"]
        nrect = out.count("<rect")
        nblocks = sum(len(s["blocks"]) for s in snap["segments"])
        if nrect < nblocks:
            problems.append(f"{nrect} rects for {nblocks} blocks")
        if "<svg" not in out or "<polyline" not in out and snap.get("timeline"):
            problems.append("output lacks the svg or the timeline")
        if problems:
            print("memory_snapshot_render: check failed: " + "; ".join(problems), file=sys.stderr)
            return 1
        print(f"memory_snapshot_render: ok: {len(snap['segments'])} segments, {nblocks} blocks, "
              f"{len(snap.get('sites', []))} sites, {len(snap.get('timeline', []))} timeline points -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
