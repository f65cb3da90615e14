"""`quantkit quantize`: the sequential layer-by-layer driver, method drivers and checkpoint assembly."""
