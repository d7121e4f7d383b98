/**
 * Registers the conformance suite with `Deno.test`: one test per case, each on a fresh fixture.
 *
 * @module
 */

import { conformanceCases, type ConformanceHarness } from "./cases.ts";

/** Registers every conformance case for `harness`. */
export function testConformance(harness: ConformanceHarness): void {
  for (const testCase of conformanceCases) {
    Deno.test({
      name: `${harness.name} conformance: ${testCase.name}`,
      ignore: (testCase.requires === "corrupt" && !harness.canCorrupt) ||
        (testCase.requires === "orderingKeys" && harness.orderingKeys === false) ||
        (testCase.requires === "keyFence" &&
          (harness.keyFence === false || harness.orderingKeys === false)) ||
        (testCase.requires === "idleKeys" &&
          (harness.idleKeys === false || harness.keyFence === false ||
            harness.orderingKeys === false)),
      async fn() {
        const fixture = await harness.open();
        try {
          await testCase.run(fixture);
        } finally {
          await fixture.close();
        }
      },
    });
  }
}
