"""Engine launch: policy, arguments, placement, ports, launch records, the router's fleet, profiling limits."""
