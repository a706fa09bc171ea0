// A tiny client-rendered site for trying render.mjs without the project's Rust test site.
// It has the same routes and page shape as that site:
//
//   GET /app/<name>[?delay=<ms>]  an application shell: an empty #root, one image, and a script
//                                 that after <delay> ms (default 150) fetches /api/<name> and
//                                 appends <p class="loaded">rendered text of <name>: ...</p>
//   GET /api/<name>               JSON {"text": "rendered text of <name>: ..."}, after 20 ms
//   GET /media/<file>             a 1x1 PNG (the renderer is expected to block it)
//   GET /stats                    JSON request counts per route since start (for checking blocking)
//
// Usage: node site.mjs <port>   (listens on 127.0.0.1 only)
import http from 'node:http';

const port = Number(process.argv[2] || 8787);

// 1x1 transparent PNG.
const PNG = Buffer.from(
    'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==',
    'base64',
);

const stats = { app: 0, api: 0, media: 0, other: 0 };

function escapeHtml(s) {
    return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function shell(name, delay) {
    const n = escapeHtml(name);
    const js = JSON.stringify(name);
    return `<!doctype html><html><head><title>${n}</title></head><body><div id="root"></div>`
        + `<img src="/media/${encodeURIComponent(name)}.png">`
        + `<script>setTimeout(()=>fetch("/api/"+encodeURIComponent(${js})).then(r=>r.json()).then(d=>{`
        + `const p=document.createElement("p");p.className="loaded";p.textContent=d.text;`
        + `document.getElementById("root").appendChild(p)}), ${delay})</script></body></html>`;
}

const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    const parts = url.pathname.split('/');
    const route = parts[1];
    const name = decodeURIComponent(parts.slice(2).join('/'));
    if (route === 'app' && name) {
        stats.app++;
        const d = Number.parseInt(url.searchParams.get('delay') ?? '150', 10);
        const delay = Number.isFinite(d) && d >= 0 ? Math.min(d, 60000) : 150;
        const body = shell(name, delay);
        res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'content-length': Buffer.byteLength(body) });
        res.end(body);
    } else if (route === 'api' && name) {
        stats.api++;
        setTimeout(() => {
            const body = JSON.stringify({
                text: `rendered text of ${name}: the names, prices and reviews a client-rendered shop fetches after its first paint`,
            });
            res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
            res.end(body);
        }, 20);
    } else if (route === 'media' && name) {
        stats.media++;
        res.writeHead(200, { 'content-type': 'image/png', 'content-length': PNG.length });
        res.end(PNG);
    } else if (url.pathname === '/stats') {
        const body = JSON.stringify(stats);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(body);
    } else {
        stats.other++;
        res.writeHead(404, { 'content-type': 'text/plain' });
        res.end('not found\n');
    }
});

server.listen(port, '127.0.0.1', () => {
    console.log(`site listening on http://127.0.0.1:${port}/app/<name>?delay=<ms>`);
});

for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => {
        console.log(`site stats: ${JSON.stringify(stats)}`);
        server.close();
        process.exit(0);
    });
}
