// Samples a process tree until its root exits, then prints one JSON line:
//   peak_rss_mb     the highest SUM of RSS over the root's descendants (VmRSS of each, so
//                   pages shared between Chromium's processes are counted once per process)
//   peak_pss_mb     the highest SUM of PSS (shared pages divided among their sharers),
//                   from /proc/<pid>/smaps_rollup; the fairer "how much memory" figure
//   peak_procs      the most descendants alive at one sample
//   procs_seen      distinct descendants seen over the run
//   cpu_s_sampled   sum over every descendant seen of its last sampled utime+stime: a
//                   cross-check (a lower bound) for /usr/bin/time's user+sys, which counts
//                   a child only once it has been waited for
//   cpu_s_sampled_by_comm  the same, by process name (node, chromium-headle, ...)
//   samples         how many samples were taken
//
// Usage: node sample_tree.mjs <root-pid> [interval-ms=100]
// The root itself is excluded (run.sh passes the pid of /usr/bin/time).
import { readFileSync, readdirSync } from 'node:fs';

const root = Number.parseInt(process.argv[2], 10);
const intervalMs = Number.parseInt(process.argv[3] ?? '100', 10);
const CLK_TCK = 100; // getconf CLK_TCK on Linux x86-64/arm64
const PAGE = 4096;

function readStat(pid) {
    // /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const close = s.lastIndexOf(')');
    const f = s.slice(close + 2).split(' ');
    // f[0] = field 3 (state); field n is f[n - 3].
    return {
        comm: s.slice(s.indexOf('(') + 1, close),
        state: f[0],
        ppid: Number(f[1]),
        ticks: Number(f[11]) + Number(f[12]), // utime + stime
        start: f[19], // starttime: tells a reused pid from the old one
        rssPages: Number(f[21]),
    };
}

function pssKb(pid) {
    try {
        const m = /^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'));
        return m ? Number(m[1]) : 0;
    } catch {
        return 0;
    }
}

const lastTicks = new Map(); // "pid:start" -> ticks
const commOf = new Map(); // "pid:start" -> comm
let peakRss = 0;
let peakPss = 0;
let peakProcs = 0;
let samples = 0;

function rootAlive() {
    try {
        return readStat(root).state !== 'Z';
    } catch {
        return false;
    }
}

function sample() {
    const stats = new Map();
    for (const name of readdirSync('/proc')) {
        const c = name.charCodeAt(0);
        if (c < 48 || c > 57) continue;
        try {
            stats.set(Number(name), readStat(name));
        } catch {
            // gone between readdir and read
        }
    }
    const children = new Map();
    for (const [pid, st] of stats) {
        if (!children.has(st.ppid)) children.set(st.ppid, []);
        children.get(st.ppid).push(pid);
    }
    let rss = 0;
    let pss = 0;
    let procs = 0;
    const stack = [...(children.get(root) ?? [])];
    while (stack.length) {
        const pid = stack.pop();
        const st = stats.get(pid);
        stack.push(...(children.get(pid) ?? []));
        if (st.state === 'Z') continue;
        procs++;
        rss += st.rssPages * PAGE;
        pss += pssKb(pid) * 1024;
        lastTicks.set(`${pid}:${st.start}`, st.ticks);
        commOf.set(`${pid}:${st.start}`, st.comm);
    }
    samples++;
    peakRss = Math.max(peakRss, rss);
    peakPss = Math.max(peakPss, pss);
    peakProcs = Math.max(peakProcs, procs);
}

function finish() {
    let ticks = 0;
    const byComm = {};
    for (const [key, t] of lastTicks) {
        ticks += t;
        const comm = commOf.get(key);
        byComm[comm] = Math.round(((byComm[comm] ?? 0) + t / CLK_TCK) * 100) / 100;
    }
    const mb = (b) => Math.round((b / 1048576) * 10) / 10;
    process.stdout.write(`${JSON.stringify({
        peak_rss_mb: mb(peakRss),
        peak_pss_mb: mb(peakPss),
        peak_procs: peakProcs,
        procs_seen: lastTicks.size,
        cpu_s_sampled: Math.round((ticks / CLK_TCK) * 100) / 100,
        cpu_s_sampled_by_comm: byComm,
        samples,
        interval_ms: intervalMs,
    })}\n`);
}

const timer = setInterval(() => {
    if (!rootAlive()) {
        clearInterval(timer);
        finish();
        return;
    }
    sample();
}, intervalMs);
sample();
