// Prints the benchmark's URL list: <n> pages /app/p<i>?delay=<100..300>, spread evenly.
// Usage: node urls.mjs <base-url> [n=200] > urls.txt   e.g. node urls.mjs http://127.0.0.1:8787
const base = (process.argv[2] || 'http://127.0.0.1:8787').replace(/\/$/, '');
const n = Number.parseInt(process.argv[3] || '200', 10);
const lines = [];
for (let i = 0; i < n; i++) lines.push(`${base}/app/p${i}?delay=${100 + ((i * 7) % 201)}`);
process.stdout.write(`${lines.join('\n')}\n`);
