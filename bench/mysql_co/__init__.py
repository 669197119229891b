"""mysql_co XA cost."""
