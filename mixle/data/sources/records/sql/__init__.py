"""SQL records: the source, its statements, the connection, the SQLite and SQLAlchemy backends."""
