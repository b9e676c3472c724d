// An idle agent on the TypeScript MCP SDK: it connects (the SDK opens the server-to-client GET
// stream after the handshake) and prints every notifications/resources/updated it receives as one
// JSON line on stdout, until it is killed. Driven by tests/doorbell/test_mcp_streams.py.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const { MCP_URL, MCP_TOKEN } = process.env;
const transport = new StreamableHTTPClientTransport(new URL(MCP_URL), {
  requestInit: { headers: { Authorization: `Bearer ${MCP_TOKEN}` } },
});
const client = new Client({ name: "switchboard-ts-listener", version: "1.0.0" });
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (notification) => {
  process.stdout.write(JSON.stringify(notification.params) + "\n");
});
await client.connect(transport);
process.stdout.write(JSON.stringify({ connected: transport.protocolVersion }) + "\n");
process.on("SIGTERM", async () => {
  await transport.close().catch(() => {});
  process.exit(0);
});
setInterval(() => {}, 1 << 30);
