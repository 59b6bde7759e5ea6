"""Serving load: closed- and open-loop traffic, MLPerf LoadGen, model instances, load levels, replicas per GPU,
generation under load, and the benchmark's serving measurements."""
