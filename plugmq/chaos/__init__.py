"""plugmq chaos: fault injection under load, then a checker over every acknowledged message."""
