// The HTTP bench's load client: C agents in a closed loop (claim_next, then complete of the todo
// it got) for D seconds, against the minimal server, Switchboard's REST or its MCP. Node, so the
// client holds no Python GIL; plain node:http with one keep-alive socket per agent, which costs
// less CPU per request than fetch. It reports its own CPU time, so the bench can show the client
// was not the bottleneck.
// Usage: node http_client.mjs KIND URL TOKEN CLIENTS SECONDS [SOCKETS]   (KIND: baseline | rest | mcp)
// SOCKETS (default 1): keep-alive sockets per agent, used in turn, one per cycle. Against several
// server processes sharing one listening socket, one socket per agent lands unevenly (the process
// that wakes first accepts several: 3/5 on 2 processes, 1/5/2/0 on 4), and the run then measures
// its busiest process; with several sockets per agent, each agent's cycles spread over them.
import http from "node:http";

const [kind, base, token, C = "8", D = "5", S = "1"] = process.argv.slice(2);
const clients = Number(C);
const sockets = Number(S);
const durationMs = Number(D) * 1000;
const MODERN = "2026-07-28";
const meta = {
  "io.modelcontextprotocol/protocolVersion": MODERN,
  "io.modelcontextprotocol/clientCapabilities": {},
};
const url = new URL(base);

function post(agent, path, body, extra) {
  const payload = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: url.hostname,
        port: url.port,
        path,
        method: "POST",
        agent,
        headers: {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
          "content-length": Buffer.byteLength(payload),
          ...extra,
        },
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString();
          if (res.statusCode !== 200) reject(new Error(`${path} -> ${res.statusCode} ${text}`));
          else resolve(JSON.parse(text));
        });
      },
    );
    req.on("error", reject);
    req.end(payload);
  });
}

async function tool(agent, name, args) {
  const out = await post(
    agent,
    url.pathname,
    { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name, arguments: args, _meta: meta } },
    {
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": MODERN,
      "mcp-method": "tools/call",
      "mcp-name": name,
    },
  );
  if (out.error || out.result.isError) throw new Error(`${name}: ${JSON.stringify(out)}`);
  return out.result.structuredContent;
}

const root = url.pathname.replace(/\/$/, "");
const ops = {
  baseline: {
    claim: (a) => post(a, `${root}/claim_next`, {}),
    complete: (a, id) => post(a, `${root}/complete`, { id }),
  },
  rest: {
    claim: (a) => post(a, `${root}/api/v1/agent/claim_next`, {}),
    complete: (a, id) => post(a, `${root}/api/v1/agent/complete`, { id }),
  },
  mcp: {
    claim: (a) => tool(a, "claim_next", {}),
    complete: (a, id) => tool(a, "complete", { id }),
  },
}[kind];
if (!ops) throw new Error(`unknown kind ${kind}`);

const latencies = [];
let cycles = 0;
let empty = 0;
const end = Date.now() + durationMs;

async function agentLoop() {
  const agents = Array.from({ length: sockets }, () => new http.Agent({ keepAlive: true, maxSockets: 1 }));
  let turn = 0;
  while (Date.now() < end) {
    const agent = agents[turn++ % sockets];
    const t0 = performance.now();
    const got = await ops.claim(agent);
    if (got.empty) {
      empty++;
      continue;
    }
    await ops.complete(agent, got.todo.id);
    latencies.push(performance.now() - t0);
    cycles++;
  }
  for (const agent of agents) agent.destroy();
}

const cpu0 = process.cpuUsage();
const t0 = performance.now();
await Promise.all(Array.from({ length: clients }, agentLoop));
const seconds = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
latencies.sort((a, b) => a - b);
const pct = (p) =>
  latencies.length
    ? +latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))].toFixed(2)
    : null;
console.log(
  JSON.stringify({
    kind,
    clients,
    sockets_per_client: sockets,
    cycles,
    empty,
    seconds: +seconds.toFixed(3),
    cycles_per_s: +(cycles / seconds).toFixed(1),
    p50_ms: pct(0.5),
    p99_ms: pct(0.99),
    client_cpu_share: +((cpu.user + cpu.system) / 1e6 / seconds).toFixed(3),
  }),
);
