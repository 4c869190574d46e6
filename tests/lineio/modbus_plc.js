// A PLC's side of the station handshake, written against the npm package modbus-serial (not pymodbus):
// node modbus_plc.js PORT STEP... ; prints one JSON object per step on stdout.
// Steps: handshake:PARTID (enable, trigger, wait AcquisitionDone and ResultValid, read, ack, drop trigger),
// trigger:PARTID (trigger, wait TriggerAck, leave), collect (wait ResultValid, read, ack),
// write:ADDR:VALUE (expects an exception, prints its code), read:ADDR:COUNT.
const ModbusRTU = require("modbus-serial");

const port = Number(process.argv[2]);
const steps = process.argv.slice(3);
const STATUS = 50, READY = 1, TRIGGER_ACK = 2, ACQ_DONE = 8, RESULT_VALID = 16;
// How long a step waits for ResultValid: a PLC waits as long as its station's result deadline allows
// (benchmarks/line_io.py passes 60 s: a cold first job on a busy 2-core CI machine took over 5 s).
const RESULT_WAIT_MS = Number(process.env.RESULT_WAIT_MS || 5000);

function text(s, regs) {
  const out = [];
  for (let i = 0; i < regs; i++) {
    const a = i * 2 < s.length ? s.charCodeAt(i * 2) : 0, b = i * 2 + 1 < s.length ? s.charCodeAt(i * 2 + 1) : 0;
    out.push((a << 8) | b);
  }
  return out;
}
function untext(regs) {
  let s = "";
  for (const r of regs) { for (const c of [r >> 8, r & 0xff]) { if (!c) return s; s += String.fromCharCode(c); } }
  return s;
}
async function until(client, mask, timeoutMs) {
  const t0 = process.hrtime.bigint();
  for (;;) {
    const { data } = await client.readHoldingRegisters(STATUS, 8);
    if ((data[0] & mask) === mask) return data;
    if (Number(process.hrtime.bigint() - t0) / 1e6 > timeoutMs) throw new Error(`status ${data[0]} never had ${mask}`);
  }
}
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6;

async function main() {
  const client = new ModbusRTU();
  await client.connectTCP("127.0.0.1", { port });
  client.setID(1);
  client.setTimeout(3000);
  for (const step of steps) {
    const [kind, a, b] = step.split(":");
    try {
      if (kind === "handshake") {
        await until(client, READY, 3000);
        const t0 = process.hrtime.bigint();
        await client.writeRegisters(0, [1 | 2, ...text(a, 16)]);  // TriggerEnable + Trigger + PartId
        const acq = await until(client, TRIGGER_ACK | ACQ_DONE, 3000);
        const tAcq = ms(t0);
        const res = await until(client, RESULT_VALID, RESULT_WAIT_MS);
        const tRes = ms(t0);
        const echo = await client.readHoldingRegisters(58, 16);
        await client.writeRegister(0, 1 | 4);  // drop Trigger, raise ResultAck
        await client.writeRegister(0, 1);      // drop ResultAck
        const after = await client.readHoldingRegisters(STATUS, 8);
        console.log(JSON.stringify({ step, seq: res[1] * 65536 + res[2], result: res[3], defect: res[4],
          part_id: untext(echo.data), acq_status: acq[0], after_status: after.data[0], buffer_after: after.data[6],
          ms_acquired: tAcq, ms_result: tRes }));
      } else if (kind === "trigger") {  // trigger and leave (the PLC drops off mid-job)
        await until(client, READY, 3000);
        await client.writeRegisters(0, [1 | 2, ...text(a, 16)]);
        const acq = await until(client, TRIGGER_ACK, 3000);
        console.log(JSON.stringify({ step, ok: true, seq: acq[1] * 65536 + acq[2] }));
      } else if (kind === "collect") {  // a fresh connection picks up the waiting result and acks it
        const res = await until(client, RESULT_VALID, RESULT_WAIT_MS);
        const echo = await client.readHoldingRegisters(58, 16);
        await client.writeRegister(0, 1 | 4);
        await client.writeRegister(0, 1);
        const after = await client.readHoldingRegisters(STATUS, 8);
        console.log(JSON.stringify({ step, ok: true, seq: res[1] * 65536 + res[2], result: res[3],
          part_id: untext(echo.data), buffer_after: after.data[6] }));
      } else if (kind === "write") {
        await client.writeRegister(Number(a), Number(b));
        console.log(JSON.stringify({ step, ok: true }));
      } else if (kind === "read") {
        const { data } = await client.readHoldingRegisters(Number(a), Number(b));
        console.log(JSON.stringify({ step, ok: true, data }));
      }
    } catch (err) {
      console.log(JSON.stringify({ step, ok: false, code: err.modbusCode ?? null, error: String(err.message || err) }));
    }
  }
  client.close(() => {});
}
main().catch((err) => { console.log(JSON.stringify({ fatal: String(err.message || err), code: err.code ?? null })); process.exit(1); });
