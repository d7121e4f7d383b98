/**
 * Registers the conformance suite with `node:test` (the Node twin of tests/conformance/deno.ts).
 *
 * @module
 */

import { test } from "node:test";
import { conformanceCases, type ConformanceHarness } from "../conformance/cases.ts";

/** Registers every conformance case for `harness`; `skip` (a reason) skips them all. */
export function testConformance(harness: ConformanceHarness, skip?: string): void {
  for (const testCase of conformanceCases) {
    test(`${harness.name} conformance: ${testCase.name}`, {
      skip: skip ?? ((testCase.requires === "corrupt" && !harness.canCorrupt) ||
        (testCase.requires === "orderingKeys" && harness.orderingKeys === false) ||
        (testCase.requires === "keyFence" &&
          (harness.keyFence === false || harness.orderingKeys === false)) ||
        (testCase.requires === "idleKeys" &&
          (harness.idleKeys === false || harness.keyFence === false ||
            harness.orderingKeys === false))),
    }, async () => {
      const fixture = await harness.open();
      try {
        await testCase.run(fixture);
      } finally {
        await fixture.close();
      }
    });
  }
}
