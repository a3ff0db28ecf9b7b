// Drives the official RocketMQ Node.js client (npm rocketmq-client-nodejs) for plugmq's tests.
//
// Reads one JSON command per line on stdin, answers each with one JSON line on stdout
// ({"id": ..., "ok": true, ...} or {"id": ..., "ok": false, "error": "..."}); a PushConsumer's
// deliveries are reported as {"event": "consumed", ...} lines as they happen. The client's own
// log goes to stderr (warnings and errors only).
'use strict';

const readline = require('node:readline');
const {
  Producer, SimpleConsumer, PushConsumer, ConsumeResult, FilterExpression,
} = require('rocketmq-client-nodejs');

const logger = {
  info() {},
  debug() {},
  warn(...args) { process.stderr.write(`WARN ${args.map(String).join(' ')}\n`); },
  error(...args) { process.stderr.write(`ERROR ${args.map(String).join(' ')}\n`); },
};

const clients = [];
let producer;
let simple;
const received = new Map(); // message id -> MessageView, kept for ack

function write(line) {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

function view(message) {
  return {
    messageId: message.messageId,
    body: message.body.toString('utf8'),
    tag: message.tag ?? null,
    keys: message.keys,
    messageGroup: message.messageGroup ?? null,
    deliveryAttempt: message.deliveryAttempt ?? null,
    corrupted: message.corrupted === true,
    properties: Object.fromEntries(message.properties),
  };
}

// What every client takes: where, TLS (command.ssl; the CA comes from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH),
// and the ACL credentials (command.credentials = {accessKey, accessSecret}).
function common(command) {
  const options = { endpoints: command.endpoints, namespace: '', logger, requestTimeout: 5000,
    sslEnabled: command.ssl === true };
  if (command.credentials) options.sessionCredentials = command.credentials;
  return options;
}

function subscriptions(command) {
  const filter = command.filter ? new FilterExpression(command.filter) : FilterExpression.SUB_ALL;
  return new Map().set(command.topic, filter);
}

const handlers = {
  async producer(command) {
    producer = new Producer({ ...common(command), topics: command.topics });
    await producer.startup();
    clients.push(producer);
    return {};
  },
  async send(command) {
    const message = { topic: command.topic, body: Buffer.from(command.body, 'utf8') };
    if (command.tag) message.tag = command.tag;
    if (command.keys) message.keys = command.keys;
    if (command.messageGroup) message.messageGroup = command.messageGroup;
    if (command.deliveryTimestampMs) message.deliveryTimestamp = new Date(command.deliveryTimestampMs);
    if (command.properties) message.properties = new Map(Object.entries(command.properties));
    const receipt = await producer.send(message);
    return { messageId: receipt.messageId };
  },
  async simple(command) {
    simple = new SimpleConsumer({ ...common(command), consumerGroup: command.group,
      subscriptions: subscriptions(command), awaitDuration: command.awaitMs });
    await simple.startup();
    clients.push(simple);
    return {};
  },
  async receive(command) {
    const messages = await simple.receive(command.max, command.invisibleMs);
    for (const message of messages) received.set(message.messageId, message);
    return { messages: messages.map(view) };
  },
  async ack(command) {
    const message = received.get(command.messageId);
    if (!message) throw new Error(`message ${command.messageId} was not received by this driver`);
    await simple.ack(message);
    received.delete(command.messageId);
    return {};
  },
  async push(command) {
    const push = new PushConsumer({
      ...common(command), consumerGroup: command.group,
      subscriptions: subscriptions(command), longPollingTimeout: command.awaitMs,
      messageListener: {
        consume(message) {
          write({ event: 'consumed', ...view(message) });
          return command.fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
        },
      },
    });
    await push.startup();
    clients.push(push);
    return {};
  },
  async shutdown() {
    for (const client of clients.reverse()) {
      try {
        await client.shutdown();
      } catch (err) {
        logger.warn('shutdown failed', err);
      }
    }
    clients.length = 0;
    return {};
  },
};

const lines = readline.createInterface({ input: process.stdin });
lines.on('line', async line => {
  if (!line.trim()) return;
  const command = JSON.parse(line);
  try {
    const handler = handlers[command.op];
    if (!handler) throw new Error(`unknown op ${command.op}`);
    write({ id: command.id, ok: true, ...(await handler(command)) });
  } catch (err) {
    write({ id: command.id, ok: false, error: String(err && err.stack ? err.stack : err) });
  }
  if (command.op === 'shutdown') process.exit(0);
});
lines.on('close', async () => {
  await handlers.shutdown();
  process.exit(0);
});
