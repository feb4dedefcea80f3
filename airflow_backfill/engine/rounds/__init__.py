"""What every round and snapshot stands on, below the stateless, aggregate and join code
that uses it: change rows netted, signed and mapped through the query (`changes`), the
range a commit applied (`applied`), and the choice of how a round writes (`plan_choice`)."""
