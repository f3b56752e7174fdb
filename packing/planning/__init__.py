"""The queue planner's core wing: the queue plan (`queue_plan`, its nodes `queue_nodes`, its room test
`queue_room`, its parts solved `queue_parts`), the working copies it plans on (`working_copy`), pickling and
copying the state by field (`by_field`), and the rule that follows a plan (`follow`). The rest of the core imports
nothing from here."""
