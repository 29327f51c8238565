// CSQLite: Debian's libsqlite3-dev through pkg-config ("sqlite3"). FanoutSQLite is the only Swift module that
// imports it.
#include <sqlite3.h>

// SQLITE_TRANSIENT is `((sqlite3_destructor_type)-1)`: a cast of -1 to a function pointer, which Swift cannot import.
// These two wrappers pass it from C, so SQLite makes its own copy of the bytes before the call returns and the Swift
// buffer they came from may be released at once (the only safe choice for a pointer Swift lends inside a closure).
static inline int CSQLite_bind_text_transient(sqlite3_stmt *statement, int index, const char *text, int bytes) {
    return sqlite3_bind_text(statement, index, text, bytes, SQLITE_TRANSIENT);
}

static inline int CSQLite_bind_blob_transient(sqlite3_stmt *statement, int index, const void *blob, int bytes) {
    return sqlite3_bind_blob(statement, index, blob, bytes, SQLITE_TRANSIENT);
}

// sqlite3_config is variadic, which Swift cannot call. SQLITE_CONFIG_MEMSTATUS off: SQLite then stops counting every
// allocation under a global mutex (a few percent of a bulk import). Only valid before SQLite initializes; later it
// returns SQLITE_MISUSE and changes nothing.
static inline int CSQLite_config_memstatus(int enabled) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, enabled);
}
