/**
 * The messages every benchmark uses: ~200-byte JSON payloads spread over 16 subjects, ids that
 * double as `Nats-Msg-Id`.
 *
 * @module
 */

import type { OutboxRecord } from "../../mod.ts";

/** Subjects per run: `<prefix>.s0` ... `<prefix>.s15`. */
export const subjectCount = 16;

/** Target size of an encoded payload, in bytes. */
export const payloadBytes = 200;

/** A JSON payload of exactly {@linkcode payloadBytes} bytes (ASCII) for message `i`. */
export function payload(i: number): string {
  const body = {
    type: "order.created",
    orderId: i,
    customerId: `c-${i % 977}`,
    total: { amount: (i % 10_000) / 100, currency: "EUR" },
    lines: 1 + (i % 5),
    note: "",
  };
  const bare = JSON.stringify(body).length;
  body.note = "x".repeat(Math.max(0, payloadBytes - bare));
  return JSON.stringify(body);
}

/** The subject of message `i` under `prefix`. */
export function subject(prefix: string, i: number): string {
  return `${prefix}.s${i % subjectCount}`;
}

/** `count` event records `<tag>-<from + k>` on `prefix`'s 16 subjects. */
export function records(tag: string, prefix: string, count: number, from = 0): OutboxRecord[] {
  return Array.from({ length: count }, (_, k) => {
    const i = from + k;
    return {
      id: `${tag}-${i}`,
      kind: "event.publish" as const,
      name: "order.created",
      subject: subject(prefix, i),
      payload: payload(i),
      headers: {},
    };
  });
}
