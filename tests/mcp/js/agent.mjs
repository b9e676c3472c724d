// An agent built on the TypeScript MCP SDK, as most agent hosts embed it. Driven by
// tests/mcp/test_mcp_typescript.py: it connects, lists the tools, runs the calls named in
// MCP_CALLS (a JSON list of [tool, arguments]; "$resources" lists and reads the resources) and
// prints one JSON report on stdout. A call that
// makes the SDK throw is reported as {"thrown": message}, so the test shows what the agent saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { MCP_URL, MCP_TOKEN, MCP_CALLS } = process.env;
const transport = new StreamableHTTPClientTransport(new URL(MCP_URL), {
  requestInit: { headers: { Authorization: `Bearer ${MCP_TOKEN}` } },
});
const client = new Client({ name: "switchboard-ts-agent", version: "1.0.0" });
const report = { calls: [] };
try {
  await client.connect(transport);
  report.protocolVersion = transport.protocolVersion;
  report.server = client.getServerVersion()?.name;
  const { tools } = await client.listTools();
  report.tools = tools.map((tool) => ({
    name: tool.name,
    outputSchema: !!tool.outputSchema,
    annotations: tool.annotations ?? null,
  }));
  // Arguments may name an earlier call's todo: {"$todo": 2} is the id of call 2's todo.
  const todoOf = (index) => report.calls[index]?.structuredContent?.todo?.id;
  for (const [name, args] of JSON.parse(MCP_CALLS || "[]")) {
    const resolved = Object.fromEntries(
      Object.entries(args).map(([k, v]) => [k, v && v.$todo !== undefined ? todoOf(v.$todo) : v]),
    );
    if (name === "$resources") {
      // Not a tool: the endpoint's todos as resources, through the SDK's own calls (each
      // result checked against the SDK's schema), reading the first one listed.
      try {
        const { resourceTemplates } = await client.listResourceTemplates();
        const { resources } = await client.listResources();
        const first = resources[0]
          ? (await client.readResource({ uri: resources[0].uri })).contents[0]
          : null;
        report.calls.push({
          name,
          templates: resourceTemplates.map((t) => t.uriTemplate),
          uris: resources.map((r) => r.uri),
          first: first && { uri: first.uri, mimeType: first.mimeType, text: JSON.parse(first.text) },
        });
      } catch (error) {
        report.calls.push({ name, thrown: String(error?.message ?? error) });
      }
      continue;
    }
    try {
      const result = await client.callTool({ name, arguments: resolved });
      const text = result.content?.[0]?.type === "text" ? result.content[0].text : null;
      report.calls.push({
        name,
        isError: result.isError === true,
        structuredContent: result.structuredContent ?? null,
        text: text === null ? null : JSON.parse(text),
      });
    } catch (error) {
      report.calls.push({ name, thrown: String(error?.message ?? error) });
    }
  }
} catch (error) {
  report.failed = String(error?.message ?? error);
} finally {
  await transport.close().catch(() => {});
}
process.stdout.write(JSON.stringify(report));
