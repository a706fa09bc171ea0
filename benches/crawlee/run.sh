#!/usr/bin/env bash
# Runs render.mjs (under reap.py and /usr/bin/time) and samples its process tree; merges
# CPU and memory into the JSON that render.mjs writes.
#
# Usage: bash run.sh <urls-file> <concurrency> <out.json>
#
# Adds to out.json:
#   cpu_s            user+sys CPU of every process of the run: node, Chromium's processes, and
#                    the `ps` that Crawlee spawns each second. reap.py runs the command as a
#                    child subreaper and reads RUSAGE_CHILDREN once all of them are reaped.
#   cpu_s_time_only  what `/usr/bin/time` alone reports (%U + %S of node and the children it
#                    waited for); lower, because Chromium's zygote and its renderers are
#                    orphaned at shutdown and would be reaped by init (see reap.py)
#   elapsed_s        wall time, start to the last process reaped
#   max_single_rss_mb  the largest ONE process (/usr/bin/time %M), not the tree
#   peak_rss_mb      peak of the SUM of RSS over all processes of the run, sampled every 100 ms
#   peak_pss_mb      the same with PSS (shared pages split among their sharers)
#   cpu_s_sampled    cross-check of cpu_s from /proc (see sample_tree.mjs)
#   cpu_per_page_s   cpu_s / pages
#   pages_per_s      pages / wall_s (wall_s: process start to the last page handled)
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: bash run.sh <urls-file> <concurrency> <out.json>" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
urls=$(realpath "$1")
conc=$2
out=$(realpath -m "$3")

# Nothing may fetch a browser; the browser is Debian's.
export PUPPETEER_SKIP_DOWNLOAD=1
export PUPPETEER_SKIP_CHROME_DOWNLOAD=1
export PUPPETEER_SKIP_CHROME_HEADLESS_SHELL_DOWNLOAD=1
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export CHROMIUM_PATH=${CHROMIUM_PATH:-/usr/bin/chromium-headless-shell}
# Crawlee must not think it runs on Lambda or the Apify platform.
unset AWS_LAMBDA_FUNCTION_MEMORY_SIZE APIFY_IS_AT_HOME || true

if [ ! -x /usr/bin/time ]; then
    apt-get install -y --no-install-recommends time >/dev/null
fi
if [ ! -x "$CHROMIUM_PATH" ]; then
    apt-get install -y --no-install-recommends chromium-headless-shell >/dev/null
fi
python=$(command -v /usr/bin/python3 python3 | head -n1 || true)
if [ -z "$python" ]; then
    apt-get install -y --no-install-recommends python3-minimal >/dev/null
    python=/usr/bin/python3
fi
if [ ! -d "$here/node_modules/crawlee" ]; then
    (cd "$here" && npm ci --no-audit --no-fund)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cd "$here" # Crawlee resolves ./storage against the working directory
"$python" ../reap.py "$tmp/reap" \
    /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" \
    node render.mjs "$urls" "$conc" "$tmp/render.json" &
root=$!
node sample_tree.mjs "$root" 100 >"$tmp/sample.json" &
sampler=$!

rc=0
wait "$root" || rc=$?
wait "$sampler" || true
if [ "$rc" -ne 0 ] || [ ! -s "$tmp/render.json" ]; then
    echo "render.mjs failed (exit $rc)" >&2
    cat "$tmp/reap" "$tmp/time" >&2 || true
    exit 1
fi

node - "$tmp/render.json" "$tmp/reap" "$tmp/time" "$tmp/sample.json" "$out" <<'EOF'
const fs = require('node:fs');
const [renderF, reapF, timeF, sampleF, outF] = process.argv.slice(2);
const r = JSON.parse(fs.readFileSync(renderF, 'utf8'));
const [elapsed, user, sys, , , stragglers] = fs.readFileSync(reapF, 'utf8').trim().split(' ').map(Number);
const [, tUser, tSys, maxKb] = fs.readFileSync(timeF, 'utf8').trim().split('\n').pop().split(' ').map(Number);
const s = JSON.parse(fs.readFileSync(sampleF, 'utf8'));
const round = (x, d = 3) => Math.round(x * 10 ** d) / 10 ** d;
const cpu = user + sys;
const merged = {
    ...r,
    wall_s: round(r.wall_s),
    first_page_s: round(r.first_page_s),
    done_s: round(r.done_s),
    elapsed_s: elapsed,
    cpu_s: round(cpu, 2),
    cpu_user_s: user,
    cpu_sys_s: sys,
    cpu_s_time_only: round(tUser + tSys, 2),
    cpu_per_page_s: round(cpu / r.pages, 4),
    pages_per_s: round(r.pages / r.wall_s, 2),
    peak_rss_mb: s.peak_rss_mb,
    peak_pss_mb: s.peak_pss_mb,
    max_single_rss_mb: round(maxKb / 1024, 1),
    peak_procs: s.peak_procs,
    procs_seen: s.procs_seen,
    cpu_s_sampled: s.cpu_s_sampled,
    cpu_s_sampled_by_comm: s.cpu_s_sampled_by_comm,
    rss_samples: s.samples,
    stragglers,
};
fs.writeFileSync(outF, JSON.stringify(merged, null, 2) + '\n');
process.stdout.write(JSON.stringify(merged, null, 2) + '\n');
EOF
