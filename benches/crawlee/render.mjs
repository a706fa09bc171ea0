// The peer in the renderer benchmark (BENCHMARKS.md): Crawlee's PuppeteerCrawler rendering
// client-side pages with Debian's chromium-headless-shell.
//
// Usage: node render.mjs <urls-file> <concurrency> <out.json>
//
// Reads one URL per line, renders them all, waits on each page for `p.loaded` (the content
// the page fetches after its first paint), takes page.content(), and writes wall times to
// out.json. CPU and summed peak RSS are measured from outside by run.sh, which merges them in.
//
// Crawlee's browser pool imports `puppeteer` for incognito contexts: package.json maps that
// name to puppeteer-core (an npm alias), so no browser is ever downloaded.
//
// Knobs (environment; the defaults are the benchmark's settings, see README.md):
//   CHROMIUM_PATH                  browser binary (/usr/bin/chromium-headless-shell)
//   CRAWLEE_INCOGNITO=1|0          a fresh browser context per page (1, as the Rust renderer does)
//   CRAWLEE_RETIRE_AFTER=<n>       pages before a browser is retired (50, the Rust default;
//                                  Crawlee's own default is 100)
//   CRAWLEE_SYSTEM_INFO_MS=<ms>    how often Crawlee samples system load: it spawns `ps -A`
//                                  each time (1000, Crawlee's default)
//   CRAWLEE_LOG_LEVEL=<level>      Crawlee's log level (WARNING)
import { readFileSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import puppeteer from 'puppeteer-core';
import { Configuration, PuppeteerCrawler, log, puppeteerUtils } from 'crawlee';

// Seconds since this process started (performance.timeOrigin is taken at process start).
const now = () => performance.now() / 1000;

const [urlsFile, concArg, outFile] = process.argv.slice(2);
if (!urlsFile || !concArg || !outFile) {
    console.error('usage: node render.mjs <urls-file> <concurrency> <out.json>');
    process.exit(2);
}
const concurrency = Number.parseInt(concArg, 10);
if (!(concurrency >= 1)) {
    console.error(`bad concurrency: ${concArg}`);
    process.exit(2);
}

const envInt = (name, dflt) => {
    const v = process.env[name];
    if (v === undefined || v === '') return dflt;
    const n = Number.parseInt(v, 10);
    if (!Number.isFinite(n)) throw new Error(`${name} is not a number: ${v}`);
    return n;
};
const incognito = (process.env.CRAWLEE_INCOGNITO ?? '1') !== '0';
const retireAfter = envInt('CRAWLEE_RETIRE_AFTER', 50);
const systemInfoMs = envInt('CRAWLEE_SYSTEM_INFO_MS', 1000);
const levelName = (process.env.CRAWLEE_LOG_LEVEL || 'WARNING').toUpperCase();
log.setLevel(log.LEVELS[levelName] ?? log.LEVELS.WARNING);

const urls = readFileSync(urlsFile, 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));

// Default patterns of blockRequests (.css .jpg .jpeg .png .svg .gif .woff .pdf .zip) plus
// images, fonts and media. Crawlee hands them to Network.setBlockedURLs (substring match).
const EXTRA_BLOCKED = [
    '.png', '.jpg', '.jpeg', '.gif', '.webp', '.avif', '.svg', '.ico', '.bmp',
    '.woff', '.woff2', '.ttf', '.otf', '.eot',
    '.mp4', '.webm', '.mp3', '.ogg',
];

// No storage on disk: request queue, statistics and key-value state stay in memory.
const config = new Configuration({
    persistStorage: false,
    purgeOnStart: true,
    systemInfoIntervalMillis: systemInfoMs,
});

const results = {
    pages: urls.length,
    ok: 0,
    failed: 0,
    no_text: 0,
    html_bytes: 0,
    wall_s: null,
    first_page_s: null,
};
const errors = {};
let lastPageS = null;

function noteDone() {
    const t = now();
    if (results.first_page_s === null) results.first_page_s = t;
    lastPageS = t;
}

const crawler = new PuppeteerCrawler(
    {
        launchContext: {
            launcher: puppeteer,
            launchOptions: {
                executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium-headless-shell',
                headless: true,
                args: [
                    '--no-sandbox',
                    '--disable-gpu',
                    '--disable-dev-shm-usage',
                    '--no-first-run',
                    '--disable-background-networking',
                    '--disable-component-update',
                    '--disable-sync',
                    '--disable-quic',
                ],
            },
            useChrome: false,
            useIncognitoPages: incognito,
        },
        browserPoolOptions: {
            useFingerprints: false,
            retireBrowserAfterPageCount: retireAfter,
        },
        maxConcurrency: concurrency,
        minConcurrency: concurrency,
        autoscaledPoolOptions: { desiredConcurrency: concurrency },
        useSessionPool: false,
        persistCookiesPerSession: false,
        maxRequestRetries: 0,
        retryOnBlocked: false,
        respectRobotsTxtFile: false,
        navigationTimeoutSecs: 30,
        requestHandlerTimeoutSecs: 60,
        preNavigationHooks: [
            async ({ page }) => {
                await puppeteerUtils.blockRequests(page, { extraUrlPatterns: EXTRA_BLOCKED });
            },
        ],
        async requestHandler({ page }) {
            await page.waitForSelector('p.loaded', { timeout: 15000 });
            const html = await page.content();
            results.html_bytes += html.length;
            if (html.includes('rendered text of')) results.ok++;
            else results.no_text++;
            noteDone();
        },
        async failedRequestHandler({ request }, error) {
            results.failed++;
            const key = String(error?.message ?? error).split('\n')[0].slice(0, 160);
            errors[key] = (errors[key] ?? 0) + 1;
            log.warning(`failed ${request.url}: ${key}`);
            noteDone();
        },
    },
    config,
);

let browsersLaunched = 0;
let browsersRetired = 0;
crawler.browserPool.on('browserLaunched', () => { browsersLaunched++; });
crawler.browserPool.on('browserRetired', () => { browsersRetired++; });

const stats = await crawler.run(urls);
results.wall_s = lastPageS;
results.done_s = now(); // after the crawler closed its browsers
results.concurrency = concurrency;
results.crawlee = {
    incognito_pages: incognito,
    retire_browser_after_pages: retireAfter,
    system_info_interval_ms: systemInfoMs,
    browsers_launched: browsersLaunched,
    browsers_retired: browsersRetired,
    requests_finished: stats.requestsFinished,
    requests_failed: stats.requestsFailed,
    retries: stats.retryHistogram?.slice(1).reduce((a, b) => a + (b ?? 0), 0) ?? 0,
};
if (Object.keys(errors).length) results.errors = errors;
writeFileSync(outFile, `${JSON.stringify(results, null, 2)}\n`);
