/**
 * Statement caching and parameter binding shared by the SQLite executors: the ones over the
 * caller's database on the calling thread (executors.ts) and the worker thread's own connection
 * (sqlite_worker_thread.ts), so both bind and cache exactly alike.
 *
 * @module
 */

/** Prepared statements kept per database object (oldest dropped first). */
export const maxCachedStatements = 256;

/** Prepared statements per database object, so executors are cheap to create. */
const statementCaches = new WeakMap<object, Map<string, unknown>>();

/** The prepared statement for `sql` on `db`, compiled on first use and cached per database. */
export function cachedStatement<S>(db: { prepare(sql: string): S }, sql: string): S {
  let cache = statementCaches.get(db);
  if (!cache) statementCaches.set(db, cache = new Map());
  let statement = cache.get(sql) as S | undefined;
  if (statement === undefined) {
    statement = db.prepare(sql);
    if (cache.size >= maxCachedStatements) cache.delete(cache.keys().next().value!);
    cache.set(sql, statement);
  }
  return statement;
}

/**
 * SQLite binds numbers, strings, bigints, bytes and null; map the rest: `undefined` binds as
 * NULL, booleans as 0/1, `Date`s as ISO text.
 */
export function sqliteParams(params: readonly unknown[]): never[] {
  return params.map((value) => {
    if (value === undefined || value === null) return null;
    if (typeof value === "boolean") return value ? 1 : 0;
    if (value instanceof Date) return value.toISOString();
    return value;
  }) as never[];
}
