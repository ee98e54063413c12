-- Argo CD health check for kiln.dev CompiledTarget (Lua 5.1, as Argo CD runs it).
-- Install as argocd-cm key resource.customizations.health.kiln.dev_CompiledTarget (README,
-- "Argo CD"). Reads the kstatus conditions the operator writes:
--   Healthy      Ready=True for the current generation, no node on a fallback
--   Degraded     Stalled=True (the spec cannot be served as written: compile attempts
--                exhausted, nodes failed the artifact, an automatic rollback), or nodes serve
--                a fallback (Degraded=True)
--   Progressing  anything else: compiling, queued, warming, waiting for the operator
local hs = { status = "Progressing", message = "waiting for the kiln operator" }
local function says(c)
  return (c.reason or "") .. ": " .. (c.message or "")
end
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (obj.status.observedGeneration == nil or obj.status.observedGeneration < generation) then
  hs.message = "waiting for the operator to observe generation " .. generation
  return hs
end
local c = {}
for _, condition in ipairs(obj.status.conditions) do
  c[condition.type] = condition
end
if c.Stalled ~= nil and c.Stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = says(c.Stalled)
  return hs
end
if c.Ready ~= nil and c.Ready.status == "True" then
  if c.Degraded ~= nil and c.Degraded.status == "True" then
    hs.status = "Degraded"
    hs.message = says(c.Degraded)
    return hs
  end
  hs.status = "Healthy"
  hs.message = c.Ready.message or ""
  return hs
end
if c.Reconciling ~= nil and c.Reconciling.status == "True" then
  hs.message = says(c.Reconciling)
elseif c.Ready ~= nil then
  hs.message = says(c.Ready)
end
return hs
