//! tensortune-records: the SQLite records database (issue 4).
