// An independent OPC UA client (node-opcua) driven by JSON lines on stdin; answers and
// notifications are JSON lines on stdout. Used by tests/lineio and benchmarks/line_io.py so that
// asyncua is not testing itself. Each request: {"id": n, "op": ..., ...}; each answer: {"id": n, ...}.
"use strict";
const readline = require("readline");
const path = require("path");
const opcua = require("node-opcua-client");
const { OPCUACertificateManager } = require("node-opcua-certificate-manager");

const NS = "urn:edge-runtime:lineio";
let client = null, session = null, sub = null, ns = 0;
const items = [];
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const now = () => Number(process.hrtime.bigint()) / 1e6;  // ms, monotonic
const node = (station, name) => `ns=${ns};s=${station}.${name}`;
const TYPES = { Boolean: opcua.DataType.Boolean, String: opcua.DataType.String, UInt32: opcua.DataType.UInt32 };

async function connect(m) {
  const manager = new OPCUACertificateManager({ rootFolder: path.join(m.pki, "pki"),
    automaticallyAcceptUnknownCertificate: true });
  await manager.initialize();
  client = opcua.OPCUAClient.create({
    applicationName: "node-test-client", applicationUri: m.applicationUri,
    securityMode: opcua.MessageSecurityMode[m.mode], securityPolicy: opcua.SecurityPolicy[m.policy],
    certificateFile: m.cert, privateKeyFile: m.key, clientCertificateManager: manager,
    endpointMustExist: false, keepSessionAlive: true, requestedSessionTimeout: 60000,
    connectionStrategy: { maxRetry: m.maxRetry ?? 0, initialDelay: 100, maxDelay: 500 },
  });
  client.on("connection_lost", () => out({ notice: "connection_lost", t: now() }));
  client.on("connection_reestablished", () => out({ notice: "connection_reestablished", t: now() }));
  client.on("after_reconnection", () => out({ notice: "after_reconnection", t: now() }));
  await client.connect(m.endpoint);
  const identity = m.user ? { type: opcua.UserTokenType.UserName, userName: m.user, password: m.password }
    : { type: opcua.UserTokenType.Anonymous };
  session = await client.createSession(identity);
  session.on("session_restored", () => out({ notice: "session_restored", t: now() }));
  const nsArray = await session.readNamespaceArray();
  ns = nsArray.indexOf(NS);
  return { ns };
}

async function call(m) {
  const types = { StartSingleJob: [opcua.DataType.String, opcua.DataType.String], ResultAck: [opcua.DataType.UInt32] };
  const t0 = now();
  const r = await session.call({ objectId: `ns=${ns};s=${m.station}`, methodId: node(m.station, m.method),
    inputArguments: m.args.map((v, i) => ({ dataType: types[m.method][i], value: v })) });
  return { status: r.statusCode.name, out: (r.outputArguments || []).map((v) => v.value), t0, t1: now() };
}

async function read(m) {
  const dvs = await session.read(m.names.map((n) => ({ nodeId: node(m.station, n), attributeId: opcua.AttributeIds.Value })));
  const values = {};
  m.names.forEach((n, i) => { values[n] = dvs[i].value.value; });
  return { values };
}

async function write(m) {
  const status = await session.write({ nodeId: node(m.station, m.name), attributeId: opcua.AttributeIds.Value,
    value: { value: { dataType: TYPES[m.type], value: m.value } } });
  return { status: status.name, t: now() };
}

async function subscribe(m) {
  if (!sub) {
    sub = await session.createSubscription2({ requestedPublishingInterval: m.interval ?? 10, requestedMaxKeepAliveCount: 50,
      requestedLifetimeCount: 6000, maxNotificationsPerPublish: 1000, publishingEnabled: true, priority: 10 });
  }
  for (const name of m.names) {
    const item = await sub.monitor({ nodeId: node(m.station, name), attributeId: opcua.AttributeIds.Value },
      { samplingInterval: m.interval ?? 10, discardOldest: true, queueSize: 100 }, opcua.TimestampsToReturn.Both);
    item.on("changed", (dv) => out({ change: name, station: m.station, value: dv.value.value, t: now() }));
    items.push(item);
  }
  if (m.events) {
    const fields = ["EventType", "Message", "Severity", "JobId", "PartId", "RecipeId", "Result", "DefectCode", "Station"];
    const filter = opcua.constructEventFilter(fields);
    const ev = await sub.monitor({ nodeId: `ns=${ns};s=${m.station}`, attributeId: opcua.AttributeIds.EventNotifier },
      { queueSize: 100, filter, discardOldest: true }, opcua.TimestampsToReturn.Both);
    ev.on("changed", (values) => {
      const o = {}; fields.forEach((f, i) => { o[f] = values[i] && values[i].value; });
      out({ event: "ResultReady", station: m.station, jobId: o.JobId, partId: o.PartId, result: o.Result,
            defectCode: o.DefectCode, t: now() });
    });
    items.push(ev);
  }
  return { monitored: items.length };
}

const ops = { connect, call, read, write, subscribe,
  close: async () => { if (session) await session.close(); if (client) await client.disconnect(); return {}; } };

const rl = readline.createInterface({ input: process.stdin });
let chain = Promise.resolve();
rl.on("line", (line) => {
  const m = JSON.parse(line);
  chain = chain.then(async () => {
    try { out({ id: m.id, ok: true, ...(await ops[m.op](m)) }); }
    catch (e) { out({ id: m.id, ok: false, error: String(e && e.message || e).slice(0, 500) }); }
  });
});
rl.on("close", () => chain.then(() => process.exit(0)));
out({ ready: true });
