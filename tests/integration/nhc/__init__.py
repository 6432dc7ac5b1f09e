"""LBNL NHC running ingero's check_ingero (contrib/nhc/ingero.nhc)."""
