/**
 * Registers the conformance suite with `node:test` (the Node twin of tests/conformance/deno.ts).
 *
 * @module
 */

import { test } from "node:test";
import { conformanceCases, type ConformanceHarness } from "../conformance/cases.ts";

/** Registers every conformance case for `harness`. */
export function testConformance(harness: ConformanceHarness): void {
  for (const testCase of conformanceCases) {
    test(`${harness.name} conformance: ${testCase.name}`, {
      skip: (testCase.requires === "corrupt" && !harness.canCorrupt) ||
        (testCase.requires === "orderingKeys" && harness.orderingKeys === false),
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
