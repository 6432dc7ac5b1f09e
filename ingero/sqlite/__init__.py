"""SQLite helpers shared by the node DB and Echo's store: the read-only SQL guard and schema migrations."""
