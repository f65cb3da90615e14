"""`quantkit quantize`: the sequential layer-by-layer pipeline, the registered methods and checkpoint assembly."""
